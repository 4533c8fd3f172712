package io.pgfork.example;

import static org.assertj.core.api.Assertions.assertThat;

import io.pgfork.spring.AutoConfigurePgfork;
import java.util.concurrent.atomic.AtomicInteger;
import org.flywaydb.core.Flyway;
import org.flywaydb.core.api.callback.Event;
import org.junit.jupiter.api.Nested;
import org.junit.jupiter.api.Test;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.boot.autoconfigure.flyway.FlywayMigrationStrategy;
import org.springframework.boot.test.context.SpringBootTest;
import org.springframework.context.annotation.Import;

/**
 * The application's Flyway at context start on Spring Boot 3.5 (its auto-configuration in
 * org.springframework.boot.autoconfigure.flyway), as on 4.0: skipped, its bean kept, unless turned off.
 */
class Boot3AppMigrationTest {
    @Nested
    @SpringBootTest
    @AutoConfigurePgfork
    @Import(FlywayEvents.class)
    class Skipped {
        @Autowired
        Flyway flyway;
        @Autowired
        FlywayEvents events;
        @Autowired
        BookRepository books;

        @Test
        void theApplicationsFlywayDidNotMigrateAtContextStart() {
            assertThat(events.seen).doesNotContain(Event.BEFORE_MIGRATE, Event.BEFORE_VALIDATE);
            assertThat(flyway.info().current().getVersion().getVersion()).isEqualTo("5");
            assertThat(books.count()).isEqualTo(2);
        }
    }

    @Nested
    @SpringBootTest(properties = "pgfork.skip-app-migrations=false")
    @AutoConfigurePgfork
    @Import(FlywayEvents.class)
    class TurnedOff {
        @Autowired
        FlywayEvents events;

        @Test
        void theApplicationsFlywayMigratedAtContextStart() {
            assertThat(events.seen).contains(Event.BEFORE_MIGRATE, Event.AFTER_MIGRATE);
        }
    }

    /** A FlywayMigrationStrategy of the application's is the one Spring Boot runs: pgfork's is only a fallback. */
    @Nested
    @SpringBootTest
    @AutoConfigurePgfork
    @Import(Counting.class)
    class OwnStrategy {
        @Autowired
        Counting strategy;

        @Test
        void theApplicationsStrategyRanAtContextStart() {
            assertThat(strategy.runs).hasValue(1);
        }
    }

    static class Counting implements FlywayMigrationStrategy {
        final AtomicInteger runs = new AtomicInteger();

        @Override
        public void migrate(Flyway flyway) {
            runs.incrementAndGet();
        }
    }
}
