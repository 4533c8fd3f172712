package io.pgfork;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.Statement;
import java.time.Duration;
import java.util.Map;
import java.util.UUID;
import org.junit.jupiter.api.Test;

/** Against the live `pgfork serve` clients/test.sh starts (PGFORK_URL, PGFORK_TOKEN), or one started for the run. */
class ClientTest {
    private static final Pgfork PG = Pgfork.get();

    @Test
    void flywayTemplateAndFreshCopies() throws Exception {
        Migrator m = Migrators.flyway("classpath:db/migration");
        TestDatabase a = PG.take(m);
        TestDatabase b = PG.take(m);
        try {
            assertNotEquals(a.config().database(), b.config().database());
            try (Connection c = Pgfork.dataSource(a).getConnection(); Statement st = c.createStatement()) {
                st.execute("INSERT INTO books (title) VALUES ('written by a')");
                try (ResultSet rs = st.executeQuery("SELECT count(*) FROM books")) {
                    rs.next();
                    assertEquals(2, rs.getInt(1), "the seed row and ours");
                }
            }
            try (Connection c = Pgfork.dataSource(b).getConnection(); Statement st = c.createStatement();
                 ResultSet rs = st.executeQuery("SELECT count(*) FROM books")) {
                rs.next();
                assertEquals(1, rs.getInt(1), "b does not see a's write");
            }
        } finally {
            PG.giveBack(a, "a", false, false);
            PG.giveBack(b, "b", false, false);
        }
    }

    @Test
    void sqlFilesHashLikeTheOtherClientsAndMigrate() throws Exception {
        java.nio.file.Path dir = java.nio.file.Path.of("src/test/resources/sql");
        Migrator m = Migrators.sqlFiles(dir);
        assertEquals(TemplateHash.of(dir, ""), m.templateHash());
        TestDatabase db = PG.take(m);
        try (Connection c = Pgfork.dataSource(db).getConnection(); Statement st = c.createStatement();
             ResultSet rs = st.executeQuery("SELECT name FROM colours ORDER BY name")) {
            assertTrue(rs.next());
            assertEquals("blue", rs.getString(1));
        } finally {
            PG.giveBack(db, "sql", false, true);
        }
    }

    @Test
    void liquibaseChangelog() throws Exception {
        TestDatabase db = PG.take(Migrators.liquibase("db/changelog/changelog.yaml"));
        try (Connection c = Pgfork.dataSource(db).getConnection(); Statement st = c.createStatement();
             ResultSet rs = st.executeQuery("SELECT count(*) FROM authors")) {
            rs.next();
            assertEquals(0, rs.getInt(1));
        } finally {
            PG.giveBack(db, "liquibase", false, false);
        }
    }

    @Test
    void aFailingMigrationDiscardsTheTemplateAndSaysWhich() {
        String hash = TemplateHash.of(null, "broken " + UUID.randomUUID());
        PgforkException e = assertThrows(PgforkException.class, () -> PG.take(Migrators.of(hash, db -> {
            try (Connection c = Migrators.connect(db); Statement st = c.createStatement()) {
                st.execute("CREATE TABLE oops (");
            }
        })));
        assertTrue(e.getMessage().contains("discarded"), e.getMessage());
        assertFalse(e.getMessage().contains(db().password()), "no password in the message");
    }

    @Test
    void unreachableServerSaysWhatToDo() {
        PgforkClient c = new PgforkClient("http://127.0.0.1:1/SECRET/api", null, Duration.ofSeconds(2));
        PgforkException e = assertThrows(PgforkException.class, () -> c.getTestDatabase("x"));
        assertTrue(e.isUnreachable());
        assertTrue(e.getMessage().contains("PGFORK_URL"), e.getMessage());
        assertFalse(e.getMessage().contains("SECRET"), e.getMessage());
    }

    @Test
    void wrongTokenIsAnErrorNamingTheVariable() {
        PgforkClient c = new PgforkClient(PG.client().baseUrl(), "not-the-token", Duration.ofSeconds(5));
        PgforkException e = assertThrows(PgforkException.class, () -> c.getTestDatabase(TemplateHash.of(null, "t")));
        assertEquals(401, e.status(), e.getMessage());
        assertTrue(e.getMessage().contains("PGFORK_TOKEN"), e.getMessage());
    }

    @Test
    void masking() {
        assertEquals("http://***@h:1/***", PgforkClient.maskBaseUrl("http://u:p@h:1/TOKEN/api"));
        assertEquals("http://h:5000", PgforkClient.maskBaseUrl("http://h:5000"));
        DatabaseConfig c = new DatabaseConfig("127.0.0.1", 5432, "u", "s3cret", "d", Map.of());
        assertFalse(c.toString().contains("s3cret"));
        assertEquals("jdbc:postgresql://127.0.0.1:5432/d?sslmode=disable", c.jdbcUrl());
    }

    private static DatabaseConfig db() {
        TestDatabase d = PG.take(Migrators.flyway("classpath:db/migration"));
        PG.giveBack(d, "peek", false, true);
        return d.config();
    }
}
