package io.pgfork.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.pgfork.Migrator;
import io.pgfork.Migrators;
import io.pgfork.Pgfork;
import io.pgfork.PgforkClient;
import java.io.IOException;
import java.io.InputStream;
import java.net.HttpURLConnection;
import java.net.URI;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import org.junit.jupiter.api.Test;

/** The DataSource a pgfork test context gets, against the live server (PGFORK_URL, PGFORK_TOKEN). */
class PgforkDataSourceTest {
    private static final Migrator COLOURS = Migrators.sqlFiles(Path.of("../pgfork/src/test/resources/sql"));

    @Test
    void aRefreshedContextGetsAFreshCopyAndClosingGivesBackTheOneTakenAhead() throws Exception {
        PgforkDataSource ds = new PgforkDataSource(COLOURS, Pgfork.get());
        String hash = COLOURS.templateHash();
        int before = inUse(hash); // copies an earlier run left out (a failed test keeps its copy)
        String first;
        try {
            ds.takeAhead(); // as the listener does before each test method of an AFTER_EACH_TEST_METHOD class
            first = ds.database().config().database();
            try (Connection c = ds.getConnection(); Statement st = c.createStatement()) {
                st.execute("INSERT INTO colours VALUES ('green')");
                assertEquals(3, count(st));
            }
            ds.refresh("first");
            ds.takeAhead();
            assertNotEquals(first, ds.database().config().database(), "a refresh hands out another copy");
            try (Connection c = ds.getConnection(); Statement st = c.createStatement()) {
                assertEquals(2, count(st), "the first test's row is not in the next copy");
            }
            assertEquals(before + 2, inUse(hash), "the current copy and the one taken ahead are out");
        } finally {
            ds.close();
        }
        assertEquals(before, inUse(hash), "closing gives back the current copy and the one taken ahead");
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
