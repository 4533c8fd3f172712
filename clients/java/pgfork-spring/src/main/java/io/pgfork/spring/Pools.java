package io.pgfork.spring;

import com.zaxxer.hikari.HikariDataSource;
import io.pgfork.TestDatabase;

/** A connection pool for a test database: HikariCP when the application has it (Spring Boot's default). */
final class Pools {
    static final boolean HIKARI = Classpath.has("com.zaxxer.hikari.HikariDataSource");

    private Pools() {
    }

    static HikariDataSource hikari(TestDatabase db) {
        HikariDataSource h = new HikariDataSource();
        h.setJdbcUrl(db.config().jdbcUrl());
        h.setUsername(db.config().username());
        h.setPassword(db.config().password());
        h.setMaximumPoolSize(4);
        // One idle connection: the pool starts when a test first asks for a connection, and its start's fail-fast
        // check opens one. Hikari keeps that connection only when minimumIdle is above 0; at 0 it closes it and
        // opens another for the test. Measured (issue 36), a copy's pool start and first connection took 19.5–23.2 ms
        // at 0 and 11.7–17.2 ms at 1, its close (on the give-back thread) 17–20 ms against under 5.
        h.setMinimumIdle(1);
        h.setPoolName("pgfork-" + db.config().database());
        return h;
    }
}
