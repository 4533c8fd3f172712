package io.pgfork.example;

import static org.assertj.core.api.Assertions.assertThat;

import io.pgfork.spring.AutoConfigurePgfork;
import org.flywaydb.core.Flyway;
import org.flywaydb.core.api.callback.Event;
import org.junit.jupiter.api.Test;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.boot.test.context.SpringBootTest;
import org.springframework.context.annotation.Import;

// The template was migrated with the application's own Flyway locations: its Flyway does not migrate (nor validate)
// the copy again when the context starts, and the Flyway bean is there as the application configures it.
@SpringBootTest
@AutoConfigurePgfork
@Import(FlywayEvents.class)
class AppMigrationSkippedTest {
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
