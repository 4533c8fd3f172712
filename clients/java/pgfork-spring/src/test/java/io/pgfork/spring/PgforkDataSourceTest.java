package io.pgfork.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.zaxxer.hikari.HikariDataSource;
import io.pgfork.Migrator;
import io.pgfork.Migrators;
import io.pgfork.Pgfork;
import io.pgfork.PgforkClient;
import io.pgfork.TestDatabase;
import java.io.IOException;
import java.io.InputStream;
import java.net.HttpURLConnection;
import java.net.URI;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import org.junit.jupiter.api.Test;

/** The DataSource a pgfork test context gets, against the live server (PGFORK_URL, PGFORK_TOKEN). */
class PgforkDataSourceTest {
    private static final Migrator COLOURS = Migrators.sqlFiles(Path.of("../pgfork/src/test/resources/sql"));

    @Test
    void aRefreshGivesAFreshCopyAndClosingGivesEveryCopyBack() throws Exception {
        PgforkDataSource ds = new PgforkDataSource(COLOURS, Pgfork.get());
        String hash = COLOURS.templateHash();
        int before = inUse(hash); // copies an earlier run left out (a failed test keeps its copy)
        String first;
        try {
            first = ds.database().config().database();
            try (Connection c = ds.getConnection(); Statement st = c.createStatement()) {
                st.execute("INSERT INTO colours VALUES ('green')");
                assertEquals(3, count(st));
            }
            ds.refresh("first"); // gives the first copy back on a background thread, makes the next ready
            String second = ds.database().config().database();
            assertNotEquals(first, second, "a refresh hands out another copy");
            try (Connection c = ds.getConnection(); Statement st = c.createStatement()) {
                assertEquals(second, database(st), "the pool's connections go to the current copy");
                assertEquals(2, count(st), "the first test's row is not in the next copy");
                st.execute("INSERT INTO colours VALUES ('yellow')");
            }
            ds.awaitBackground();
            assertEquals(before + 2, inUse(hash),
                    "the current copy and the one made ready for the next test are out: the first one was given back");
            ds.refresh("second");
            TestDatabase third = ds.database(); // made ready while the second copy served its test
            assertNotEquals(second, third.config().database());
            try (Connection c = Pgfork.dataSource(third).getConnection()) {
                assertEquals(2, sessions(c, third.config().database()),
                        "the copy made ready ahead has its pool's connection open before the test asks for one");
            }
            try (Connection c = ds.getConnection(); Statement st = c.createStatement()) {
                assertEquals(third.config().database(), database(st), "no connection of a copy given back is handed out");
                assertEquals(2, count(st));
            }
        } finally {
            ds.close();
        }
        assertEquals(before, inUse(hash), "closing gives the current copy and the one made ready back before it returns");
    }

    @Test
    void aContextWaitingBetweenTestClassesHoldsNoCopy() throws Exception {
        PgforkDataSource ds = new PgforkDataSource(COLOURS, Pgfork.get());
        String hash = COLOURS.templateHash();
        int before = inUse(hash);
        try {
            try (Connection c = ds.getConnection(); Statement st = c.createStatement()) {
                st.execute("INSERT INTO colours VALUES ('green')");
            }
            ds.refresh("FirstClass.test"); // the class's last test: the next copy gets ready ahead
            // The pool opens its idle connection to the next copy at once (Pools: minimum idle 1), which makes that
            // copy current and one more ready ahead. Once the pool has it and the background work is done, the
            // context holds exactly those two, and the first copy is back.
            HikariDataSource pool = ds.unwrap(HikariDataSource.class);
            long deadline = System.nanoTime() + 60_000_000_000L;
            while (pool.getHikariPoolMXBean().getTotalConnections() == 0 && System.nanoTime() < deadline) {
                Thread.sleep(20);
            }
            assertEquals(1, pool.getHikariPoolMXBean().getTotalConnections(), "the pool opened its idle connection again");
            ds.awaitBackground();
            assertEquals(before + 2, inUse(hash), "the current copy and the one made ready ahead are out, the first is back");
            ds.park(); // the class ended: its context waits in Spring's cache
            ds.awaitBackground();
            assertEquals(before, inUse(hash), "a context waiting between classes holds no copy");
            // The pool does not fill itself up again (its minimum idle connection) with a copy.
            pool.getHikariPoolMXBean().softEvictConnections();
            assertEquals(0, pool.getMinimumIdle(), "a waiting context's pool opens no connection of its own");
            assertEquals(before, inUse(hash), "a waiting context holds no copy");
            try (Connection c = ds.getConnection(); Statement st = c.createStatement()) {
                assertEquals(2, count(st), "the next class's first test gets a fresh copy");
            }
            assertEquals(1, pool.getMinimumIdle(), "a context in use again fills its pool as before");
        } finally {
            ds.close();
        }
        assertEquals(before, inUse(hash), "closing gives every copy back");
    }

    private static int sessions(Connection c, String database) throws SQLException {
        try (PreparedStatement st = c.prepareStatement("SELECT count(*) FROM pg_stat_activity WHERE datname = ?")) {
            st.setString(1, database);
            try (ResultSet rs = st.executeQuery()) {
                rs.next();
                return rs.getInt(1);
            }
        }
    }

    private static String database(Statement st) throws SQLException {
        try (ResultSet rs = st.executeQuery("SELECT current_database()")) {
            rs.next();
            return rs.getString(1);
        }
    }

    private static int count(Statement st) throws SQLException {
        try (ResultSet rs = st.executeQuery("SELECT count(*) FROM colours")) {
            rs.next();
            return rs.getInt(1);
        }
    }

    /** The template's databases handed out and not given back, as the server counts them. */
    private static int inUse(String hash) throws IOException {
        PgforkClient client = Pgfork.get().client();
        HttpURLConnection c = (HttpURLConnection) URI.create(client.baseUrl() + "/api/v2/templates").toURL().openConnection();
        String token = System.getenv("PGFORK_TOKEN");
        if (token != null && !token.isEmpty()) {
            c.setRequestProperty("Authorization", "Bearer " + token);
        }
        try (InputStream in = c.getInputStream()) {
            for (JsonNode t : new ObjectMapper().readTree(in).path("templates")) {
                if (hash.equals(t.path("templateHash").asText())) {
                    return t.path("databases").path("in_use").asInt();
                }
            }
        }
        return 0;
    }
}
