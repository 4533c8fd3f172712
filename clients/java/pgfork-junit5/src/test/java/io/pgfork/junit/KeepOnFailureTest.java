package io.pgfork.junit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.platform.engine.discovery.DiscoverySelectors.selectClass;

import io.pgfork.Pgfork;
import io.pgfork.TestDatabase;
import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.SQLException;
import java.sql.Statement;
import org.junit.jupiter.api.Test;
import org.junit.platform.testkit.engine.EngineTestKit;

/** A failing test's database is kept, as the test left it, and its URL printed with the password masked. */
class KeepOnFailureTest {
    /** Run by the test kit only (its name keeps Surefire from running it on its own). */
    @PgforkTest
    static class FailingExample {
        static TestDatabase seen;

        @Test
        void failsAfterWriting(TestDatabase db, Connection c) throws SQLException {
            seen = db;
            try (Statement st = c.createStatement()) {
                st.execute("INSERT INTO books (title) VALUES ('evidence')");
            }
            throw new AssertionError("on purpose");
        }
    }

    @Test
    void keptAndPrinted() throws SQLException {
        PrintStream old = System.err;
        ByteArrayOutputStream err = new ByteArrayOutputStream();
        System.setErr(new PrintStream(err, true, StandardCharsets.UTF_8));
        try {
            EngineTestKit.engine("junit-jupiter").selectors(selectClass(FailingExample.class)).execute()
                    .testEvents().assertStatistics(s -> s.failed(1));
        } finally {
            System.setErr(old);
        }
        TestDatabase db = FailingExample.seen;
        assertNotNull(db);
        String printed = err.toString(StandardCharsets.UTF_8);
        assertTrue(printed.contains("keeping its database") && printed.contains(db.config().database()), printed);
        assertFalse(printed.contains(db.config().password()), "the password is masked: " + printed);
        try (Connection c = Pgfork.dataSource(db).getConnection(); Statement st = c.createStatement()) {
            assertEquals(2, PerMethodTest.count(st), "the kept database is as the test left it");
        }
        Pgfork.get().client().recreate(db); // done looking: give it back
    }
}
