package io.pgfork.example;

import static org.assertj.core.api.Assertions.assertThat;

import io.pgfork.junit.PgforkTest;
import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import org.junit.jupiter.api.RepeatedTest;

// Without Spring: the same Flyway migrations, a database per test method.
@PgforkTest(flyway = "classpath:db/migration")
class PlainJUnitTest {
    @RepeatedTest(4)
    void freshEveryTime(Connection c) throws SQLException {
        try (Statement st = c.createStatement()) {
            st.executeUpdate("DELETE FROM book WHERE copies = 1");
            try (ResultSet rs = st.executeQuery("SELECT count(*) FROM book")) {
                rs.next();
                assertThat(rs.getInt(1)).isEqualTo(1);
            }
        }
    }
}
