package io.pgfork.example;

import static org.assertj.core.api.Assertions.assertThat;

import io.pgfork.spring.AutoConfigurePgfork;
import org.flywaydb.core.api.callback.Event;
import org.junit.jupiter.api.Test;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.boot.test.context.SpringBootTest;
import org.springframework.context.annotation.Import;

// pgfork.skip-app-migrations=false: the application's Flyway runs at context start as without pgfork (and finds
// the copy up to date).
@SpringBootTest(properties = "pgfork.skip-app-migrations=false")
@AutoConfigurePgfork
@Import(FlywayEvents.class)
class AppMigrationRunTest {
    @Autowired
    FlywayEvents events;

    @Test
    void theApplicationsFlywayMigratedAtContextStart() {
        assertThat(events.seen).contains(Event.BEFORE_MIGRATE, Event.AFTER_MIGRATE);
    }
}
