package io.pgfork;

import java.util.SortedMap;
import java.util.TreeMap;
import org.flywaydb.core.Flyway;

/** Flyway migrations at some locations; loaded only when Flyway is on the classpath. */
final class FlywayMigrator implements Migrator {
    private final String[] locations;

    FlywayMigrator(String[] locations) {
        this.locations = locations;
    }

    @Override
    public String templateHash() {
        ClassLoader cl = Thread.currentThread().getContextClassLoader();
        SortedMap<String, byte[]> files = new TreeMap<>(TemplateHash.BYTES);
        for (int i = 0; i < locations.length; i++) {
            String prefix = locations.length == 1 ? "" : i + "/";
            ClasspathFiles.of(locations[i], cl).forEach((k, v) -> files.put(prefix + k, v));
        }
        return TemplateHash.ofFiles(files, "flyway\n" + String.join(",", locations));
    }

    @Override
    public void migrate(DatabaseConfig db) {
        Flyway.configure()
                .dataSource(db.jdbcUrl(), db.username(), db.password())
                .locations(locations)
                .load()
                .migrate();
    }

    @Override
    public String toString() {
        return "Flyway " + String.join(",", locations);
    }
}
