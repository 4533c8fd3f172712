package io.pgfork.example;

import static org.assertj.core.api.Assertions.assertThat;

import com.zaxxer.hikari.HikariDataSource;
import io.pgfork.spring.AutoConfigurePgfork;
import javax.sql.DataSource;
import org.junit.jupiter.api.Test;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.boot.jdbc.test.autoconfigure.JdbcTest;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.test.context.TestPropertySource;

// The application's connection pool settings (spring.datasource.hikari.*) apply to pgfork's pool as they would to
// Spring Boot's own: an application that relies on them behaves the same under pgfork.
@JdbcTest
@AutoConfigurePgfork
@TestPropertySource(properties = {
    "spring.datasource.hikari.maximum-pool-size=7",
    "spring.datasource.hikari.minimumIdle=2",
    "spring.datasource.hikari.connection-init-sql=SET application_name = 'library-pool'",
    "spring.datasource.hikari.schema=pg_catalog",
})
class PoolSettingsTest {
    @Autowired
    DataSource dataSource;

    @Autowired
    JdbcTemplate jdbc;

    @Test
    void theApplicationsHikariSettingsApply() throws Exception {
        HikariDataSource pool = dataSource.unwrap(HikariDataSource.class);
        assertThat(pool.getMaximumPoolSize()).isEqualTo(7);
        assertThat(pool.getMinimumIdle()).isEqualTo(2);
        assertThat(jdbc.queryForObject("SELECT current_setting('application_name')", String.class)).isEqualTo("library-pool");
        assertThat(jdbc.queryForObject("SELECT current_schema()", String.class)).isEqualTo("pg_catalog");
        // Still the migrated copy, by its qualified name.
        assertThat(jdbc.queryForObject("SELECT count(*) FROM public.book", Integer.class)).isEqualTo(2);
    }
}
