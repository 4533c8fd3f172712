package io.pgfork.example;

import static org.assertj.core.api.Assertions.assertThat;

import io.pgfork.spring.AutoConfigurePgfork;
import org.junit.jupiter.api.Nested;
import org.junit.jupiter.api.Test;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.boot.test.autoconfigure.jdbc.JdbcTest;
import org.springframework.jdbc.core.JdbcTemplate;

// Spring Boot 3.5: an application whose schema comes from Spring's SQL init scripts (spring.sql.init, as
// spring-petclinic's): the template runs them once, and Spring's SQL init does not run them again against the copy.
class Boot3SqlInitScriptsTest {
    @Nested
    @JdbcTest(properties = {"spring.flyway.enabled=false", "spring.sql.init.mode=always",
            "spring.sql.init.schema-locations=classpath:db/sqlinit/schema.sql",
            "spring.sql.init.data-locations=classpath:db/sqlinit/data.sql"})
    @AutoConfigurePgfork
    class Skipped {
        @Autowired
        JdbcTemplate jdbc;

        @Test
        void theScriptsRanOnceInTheTemplate() {
            assertThat(jdbc.queryForObject("SELECT count(*) FROM shelf", Integer.class)).isEqualTo(1);
            assertThat(jdbc.queryForObject("SELECT to_regclass('flyway_schema_history') IS NULL", Boolean.class)).isTrue();
        }

        @Test
        void eachTestHasItsOwnCopy() {
            jdbc.update("INSERT INTO shelf (name) VALUES ('poetry')");
            assertThat(jdbc.queryForObject("SELECT count(*) FROM shelf", Integer.class)).isEqualTo(2);
        }
    }

    @Nested
    @JdbcTest(properties = {"spring.flyway.enabled=false", "spring.sql.init.mode=always",
            "spring.sql.init.schema-locations=classpath:db/sqlinit/schema.sql",
            "spring.sql.init.data-locations=classpath:db/sqlinit/data.sql", "pgfork.skip-app-migrations=false"})
    @AutoConfigurePgfork
    class TurnedOff {
        @Autowired
        JdbcTemplate jdbc;

        @Test
        void springsSqlInitRanAgainAtContextStart() {
            assertThat(jdbc.queryForObject("SELECT count(*) FROM shelf", Integer.class)).isEqualTo(2);
        }
    }

    // Flyway's schema and test data from Spring's SQL init, which Boot 3.5 also runs after Flyway.
    @Nested
    @JdbcTest(properties = {"spring.sql.init.mode=always", "spring.sql.init.data-locations=classpath:db/sqlinit/seed.sql"})
    @AutoConfigurePgfork
    class AfterFlyway {
        @Autowired
        JdbcTemplate jdbc;

        @Test
        void aCopyHasFlywaysRowsAndTheScriptsOnce() {
            assertThat(jdbc.queryForObject("SELECT count(*) FROM book", Integer.class)).isEqualTo(3);
            jdbc.update("DELETE FROM book WHERE isbn = '978-1593279509'");
        }

        @Test
        void theNextCopyHasThemToo() {
            assertThat(jdbc.queryForObject("SELECT count(*) FROM book", Integer.class)).isEqualTo(3);
            jdbc.update("DELETE FROM book WHERE isbn = '978-1593279509'");
        }
    }
}

