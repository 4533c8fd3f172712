package io.pgfork.example;

import static org.assertj.core.api.Assertions.assertThat;

import io.pgfork.spring.AutoConfigurePgfork;
import org.junit.jupiter.api.Test;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.boot.jdbc.test.autoconfigure.JdbcTest;
import org.springframework.jdbc.core.JdbcTemplate;

@JdbcTest
@AutoConfigurePgfork
class LoanReportJdbcTest {
    @Autowired
    JdbcTemplate jdbc;

    @Test
    void plainJdbcSeesTheMigratedSchema() {
        assertThat(jdbc.queryForObject("SELECT count(*) FROM book", Integer.class)).isEqualTo(2);
        assertThat(jdbc.queryForObject("SELECT max(version) FROM flyway_schema_history", String.class)).isEqualTo("5");
    }

    @Test
    void aPartialIndexServesOpenLoans() {
        assertThat(jdbc.queryForObject("SELECT indexdef FROM pg_indexes WHERE indexname = 'loan_open'", String.class))
                .contains("WHERE (NOT returned)");
    }

    @Test
    void writesWithJdbc() {
        jdbc.update("INSERT INTO member (email, name) VALUES ('linus@example.org', 'Linus')");
        assertThat(jdbc.queryForObject("SELECT count(*) FROM member", Integer.class)).isEqualTo(2);
    }

    @Test
    void itRunsOnRealPostgreSQL() {
        assertThat(jdbc.queryForObject("SELECT current_setting('server_version_num')::int", Integer.class))
                .isGreaterThanOrEqualTo(150000);
    }
}
