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
        h.setMinimumIdle(0); // connections are opened when a test asks, not ahead for a database about to be replaced
        h.setPoolName("pgfork-" + db.config().database());
        return h;
    }
}
