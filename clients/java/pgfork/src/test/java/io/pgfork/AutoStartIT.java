package io.pgfork;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.Statement;
import org.junit.jupiter.api.Test;

/**
 * Run by Surefire's "autostart" execution with no server configured (PGFORK_URL and PGFORK_TOKEN removed from the
 * environment) and PGFORK_BIN naming a pgfork build: the client starts `pgfork serve` for the run itself.
 */
class AutoStartIT {
    @Test
    void startsAServerWhenNoneIsConfigured() throws Exception {
        assertFalse(Settings.serverConfigured(), "this execution runs with no PGFORK_URL");
        Pgfork pg;
        // Whatever answers at the default address is not the run's server unless configured (docs/SECURITY.md,
        // rule 3): another user's fake there got the template request and handed back its own database.
        try (ServeTrustTest.Fake squatter = new ServeTrustTest.Fake(5000)) {
            pg = Pgfork.get();
            assertEquals(java.util.List.of(), squatter.got, "the server at the default address was sent nothing");
        }
        Path state = ServeLauncher.stateDir();
        assertTrue(Files.exists(state.resolve("serve.json")), "the started server is recorded for the run's other JVMs");
        assertEquals("rw-------", java.nio.file.attribute.PosixFilePermissions.toString(
                Files.getPosixFilePermissions(state.resolve("serve.json"))), "it holds the token: private");
        assertTrue(pg.client().baseUrl().startsWith("http://127.0.0.1:"), pg.client().maskedBaseUrl());
        // Another JVM of the run finds it by its own record, proven (pid, start time, uid, the flock it holds).
        PgforkClient found = ServeLauncher.running(state);
        assertTrue(found != null, "the started serve is found by its record in the state directory");
        assertEquals(pg.client().baseUrl(), found.baseUrl());
        TestDatabase db = pg.take(Migrators.flyway("classpath:db/migration"));
        try (Connection c = Pgfork.dataSource(db).getConnection(); Statement st = c.createStatement();
             ResultSet rs = st.executeQuery("SELECT count(*) FROM books")) {
            rs.next();
            assertEquals(1, rs.getInt(1));
        } finally {
            pg.giveBack(db, "autostart", false, false);
        }
    }
}
