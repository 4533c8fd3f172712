package io.pgfork.example;

import static org.assertj.core.api.Assertions.assertThat;

import io.pgfork.spring.AutoConfigurePgfork;
import java.util.concurrent.atomic.AtomicInteger;
import org.flywaydb.core.Flyway;
import org.junit.jupiter.api.Test;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.boot.flyway.autoconfigure.FlywayMigrationStrategy;
import org.springframework.boot.test.context.SpringBootTest;
import org.springframework.context.annotation.Import;

// A FlywayMigrationStrategy of the application's (here the test's) is the one Spring Boot runs: pgfork's no-op
// strategy is registered only when the context has none.
@SpringBootTest
@AutoConfigurePgfork
@Import(OwnMigrationStrategyTest.Counting.class)
class OwnMigrationStrategyTest {
    static class Counting implements FlywayMigrationStrategy {
        final AtomicInteger runs = new AtomicInteger();

        @Override
        public void migrate(Flyway flyway) {
            runs.incrementAndGet();
        }
    }

    @Autowired
    Counting strategy;

    @Test
    void theApplicationsStrategyRanAtContextStart() {
        assertThat(strategy.runs).hasValue(1);
    }
}
