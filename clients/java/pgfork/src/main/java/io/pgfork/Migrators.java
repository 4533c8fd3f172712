package io.pgfork;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.stream.Collectors;
import java.util.stream.Stream;

/**
 * The usual {@link Migrator}s. Each hashes the migration files themselves, so the template changes exactly when a
 * migration does; Flyway and Liquibase are used when the project has them (they are optional dependencies).
 */
public final class Migrators {
    private Migrators() {
    }

    /**
     * Flyway migrations at the given locations (as Flyway spells them; default {@code classpath:db/migration}).
     *
     * @param locations Flyway locations
     * @return the migrator
     */
    public static Migrator flyway(String... locations) {
        String[] locs = locations.length == 0 ? new String[] {"classpath:db/migration"} : locations.clone();
        requireClass("org.flywaydb.core.Flyway", "org.flywaydb:flyway-core (and flyway-database-postgresql)");
        return new FlywayMigrator(locs);
    }

    /**
     * A Liquibase changelog on the classpath; every file in the changelog's directory is hashed.
     *
     * @param changelog the changelog's classpath path, e.g. {@code db/changelog/db.changelog-master.yaml}
     * @return the migrator
     */
    public static Migrator liquibase(String changelog) {
        requireClass("liquibase.Liquibase", "org.liquibase:liquibase-core");
        return new LiquibaseMigrator(changelog);
    }

    /**
     * A directory of plain SQL files: every file is hashed, the {@code *.sql} files at its top run in name order,
     * each as one script. Its hash equals the other clients' for the same directory (Go's SQLDir, Python's,
     * JavaScript's, Rust's).
     *
     * @param dir the directory
     * @return the migrator
     */
    public static Migrator sqlFiles(Path dir) {
        return new Migrator() {
            @Override
            public String templateHash() {
                return TemplateHash.of(dir, "");
            }

            @Override
            public void migrate(DatabaseConfig db) throws IOException, SQLException {
                List<Path> files;
                try (Stream<Path> s = Files.list(dir)) {
                    files = s.filter(p -> p.getFileName().toString().endsWith(".sql") && Files.isRegularFile(p))
                            .sorted((a, b) -> TemplateHash.BYTES.compare(a.getFileName().toString(), b.getFileName().toString()))
                            .toList();
                }
                try (Connection c = connect(db); Statement st = c.createStatement()) {
                    for (Path f : files) {
                        try {
                            st.execute(Files.readString(f, StandardCharsets.UTF_8));
                        } catch (SQLException e) {
                            throw new SQLException(f.getFileName() + ": " + e.getMessage(), e.getSQLState(), e);
                        }
                    }
                }
            }

            @Override
            public String toString() {
                return "SQL files in " + dir;
            }
        };
    }

    /**
     * A migrator of your own: a hash you compute (for example {@link TemplateHash#of}) and the code that migrates.
     *
     * @param templateHash the template hash
     * @param migrate the migration
     * @return the migrator
     */
    public static Migrator of(String templateHash, Migration migrate) {
        return new Migrator() {
            @Override
            public String templateHash() {
                return templateHash;
            }

            @Override
            public void migrate(DatabaseConfig db) throws Exception {
                migrate.migrate(db);
            }
        };
    }

    /**
     * Migrators run one after the other on the same template (for example an application's Flyway, then the Spring SQL
     * init scripts Boot runs after it). The hash is over the steps' hashes, in order: the same steps in another order
     * are another template.
     *
     * @param steps the migrators, in the order they run
     * @return the migrator
     */
    public static Migrator sequence(Migrator... steps) {
        List<Migrator> all = List.of(steps);
        Map<String, byte[]> hashes = new LinkedHashMap<>();
        for (int i = 0; i < all.size(); i++) {
            hashes.put(String.format("%04d", i), all.get(i).templateHash().getBytes(StandardCharsets.UTF_8));
        }
        String hash = TemplateHash.ofFiles(hashes, "pgfork sequence of migrators");
        return new Migrator() {
            @Override
            public String templateHash() {
                return hash;
            }

            @Override
            public void migrate(DatabaseConfig db) throws Exception {
                for (Migrator m : all) {
                    m.migrate(db);
                }
            }

            @Override
            public String toString() {
                return all.stream().map(Object::toString).collect(Collectors.joining(", then "));
            }
        };
    }

    /** Code that migrates a template database. */
    @FunctionalInterface
    public interface Migration {
        /**
         * Migrates db.
         *
         * @param db the template database
         * @throws Exception when it fails
         */
        void migrate(DatabaseConfig db) throws Exception;
    }

    /**
     * A JDBC connection to db (the PostgreSQL driver).
     *
     * @param db the database
     * @return an open connection
     * @throws SQLException when it cannot connect
     */
    public static Connection connect(DatabaseConfig db) throws SQLException {
        return DriverManager.getConnection(db.jdbcUrl(), db.username(), db.password());
    }

    private static void requireClass(String name, String artifact) {
        try {
            Class.forName(name, false, Migrators.class.getClassLoader());
        } catch (ClassNotFoundException e) {
            throw new PgforkException("pgfork: " + name + " is not on the classpath: add " + artifact
                    + " to the project's test dependencies", e);
        }
    }
}
