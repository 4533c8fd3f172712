package io.pgfork.junit;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import javax.sql.DataSource;
import org.junit.jupiter.api.RepeatedTest;

@PgforkTest(flyway = "classpath:db/migration")
class PerMethodTest {
    @RepeatedTest(3)
    void everyTestWritesToItsOwnCopy(DataSource ds) throws SQLException {
        try (Connection c = ds.getConnection(); Statement st = c.createStatement()) {
            assertEquals(1, count(st), "only the seed row: no other test's write");
            st.execute("INSERT INTO books (title) VALUES ('mine')");
            assertEquals(2, count(st));
        }
    }

    static int count(Statement st) throws SQLException {
        try (ResultSet rs = st.executeQuery("SELECT count(*) FROM books")) {
            rs.next();
            return rs.getInt(1);
        }
    }
}
