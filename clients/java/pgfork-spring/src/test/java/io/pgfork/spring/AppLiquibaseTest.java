package io.pgfork.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.sql.SQLException;
import java.sql.Statement;
import javax.sql.DataSource;
import liquibase.integration.spring.SpringLiquibase;
import org.junit.jupiter.api.Nested;
import org.junit.jupiter.api.Test;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.test.context.TestPropertySource;
import org.springframework.test.context.junit.jupiter.SpringJUnitConfig;

/**
 * An application migrated by Liquibase (its SpringLiquibase bean, as Spring Boot makes it): the template is migrated
 * by the same changelog, so the application's Liquibase does not run again at context start. The changelog adds a
 * row to {@code starts} at every run: the template's run made one.
 */
class AppLiquibaseTest {
    static final String CHANGELOG = "classpath:db/starts/changelog.yaml";

    @Configuration
    static class App {
        @Bean
        SpringLiquibase liquibase(DataSource ds) {
            SpringLiquibase l = new SpringLiquibase();
            l.setDataSource(ds);
            l.setChangeLog(CHANGELOG);
            return l;
        }
    }

    @Nested
    @SpringJUnitConfig(App.class)
    @TestPropertySource(properties = "spring.liquibase.change-log=" + CHANGELOG)
    @AutoConfigurePgfork
    class Skipped {
        @Autowired
        SpringLiquibase liquibase;
        @Autowired
        DataSource ds;

        @Test
        void theApplicationsLiquibaseDidNotRunAtContextStart() throws SQLException {
            assertEquals(CHANGELOG, liquibase.getChangeLog(), "the application's SpringLiquibase bean is there");
            assertEquals(1, starts(ds), "only the template's run of the changelog");
        }
    }

    @Nested
    @SpringJUnitConfig(App.class)
    @TestPropertySource(properties = {"spring.liquibase.change-log=" + CHANGELOG, "pgfork.skip-app-migrations=false"})
    @AutoConfigurePgfork
    class TurnedOff {
        @Autowired
        DataSource ds;

        @Test
        void theApplicationsLiquibaseRanAtContextStart() throws SQLException {
            assertEquals(2, starts(ds), "the template's run and the application's at context start");
        }
    }

    static int starts(DataSource ds) throws SQLException {
        try (var c = ds.getConnection(); Statement st = c.createStatement(); var rs = st.executeQuery("SELECT count(*) FROM starts")) {
            rs.next();
            return rs.getInt(1);
        }
    }
}
