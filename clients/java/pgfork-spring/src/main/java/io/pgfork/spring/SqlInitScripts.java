package io.pgfork.spring;

import io.pgfork.DatabaseConfig;
import io.pgfork.Migrator;
import io.pgfork.Migrators;
import io.pgfork.TemplateHash;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.sql.Connection;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.springframework.core.env.Environment;
import org.springframework.core.io.Resource;
import org.springframework.core.io.support.PathMatchingResourcePatternResolver;
import org.springframework.jdbc.datasource.init.ResourceDatabasePopulator;

/**
 * The application's Spring SQL initialization scripts ({@code spring.sql.init.schema-locations} and
 * {@code data-locations}; by default {@code schema-${platform}.sql}, {@code schema.sql}, {@code data-${platform}.sql}
 * and {@code data.sql} on the classpath, as Spring Boot finds them) as the template's migration: run once on the
 * template the way Boot runs them (Spring's {@code ResourceDatabasePopulator}, the application's separator, encoding
 * and continue-on-error), schema scripts first, hashed by the scripts' content and those settings. Used only when
 * spring-jdbc is on the classpath (Boot's SQL initialization needs it too).
 */
final class SqlInitScripts {
    private static final String PREFIX = "spring.sql.init.";

    private SqlInitScripts() {
    }

    /**
     * @return whether the application initializes its database with Spring's SQL scripts: spring-jdbc present, mode
     *     not never, and not deferred until Hibernate made the schema ({@code spring.jpa.defer-datasource-initialization},
     *     whose scripts need Hibernate's tables, which a template does not have)
     */
    static boolean used(Environment env) {
        return Classpath.has("org.springframework.jdbc.datasource.init.ResourceDatabasePopulator")
                && !"never".equalsIgnoreCase(env.getProperty(PREFIX + "mode", "embedded").trim())
                && !env.getProperty("spring.jpa.defer-datasource-initialization", Boolean.class, false);
    }

    /**
     * @return whether Boot runs the application's SQL init scripts against PostgreSQL beside its Flyway or Liquibase:
     *     spring-jdbc present, {@code spring.sql.init.mode=always} (the default, {@code embedded}, skips them on
     *     PostgreSQL) and not deferred until Hibernate made the schema. Boot runs them after Flyway and Liquibase
     *     (its script initializers' detector comes last), so they may fill the tables the migrations made.
     */
    static boolean alongside(Environment env) {
        return Classpath.has("org.springframework.jdbc.datasource.init.ResourceDatabasePopulator")
                && "always".equalsIgnoreCase(env.getProperty(PREFIX + "mode", "embedded").trim())
                && !env.getProperty("spring.jpa.defer-datasource-initialization", Boolean.class, false);
    }

    /**
     * The scripts Boot would run, schema then data, each a resolved resource (an optional location that matches
     * nothing is left out, as Boot leaves it out).
     *
     * @return the scripts, empty when there are none
     */
    static List<Resource> scripts(Environment env, ClassLoader loader) {
        String platform = env.getProperty(PREFIX + "platform", "all");
        List<Resource> scripts = new ArrayList<>();
        PathMatchingResourcePatternResolver resolver = new PathMatchingResourcePatternResolver(loader);
        for (String kind : new String[] {"schema", "data"}) {
            List<String> locations = locations(env, PREFIX + kind + "-locations");
            if (locations == null) {
                locations = List.of("optional:classpath*:" + kind + "-" + platform + ".sql", "optional:classpath*:" + kind + ".sql");
            }
            for (String location : locations) {
                boolean optional = location.startsWith("optional:");
                String l = optional ? location.substring("optional:".length()) : location;
                Resource[] found;
                try {
                    found = resolver.getResources(l);
                } catch (IOException e) {
                    throw new UncheckedIOException("pgfork: reading " + kind + " script " + location, e);
                }
                List<Resource> existing = Arrays.stream(found).filter(Resource::exists).toList();
                if (existing.isEmpty() && !optional) {
                    throw new IllegalStateException("pgfork: no " + kind + " script found at " + location
                            + " (" + PREFIX + kind + "-locations): Spring Boot's SQL initialization would fail the same way");
                }
                scripts.addAll(existing);
            }
        }
        return scripts;
    }

    /** The migrator that runs scripts on the template. */
    static Migrator migrator(Environment env, List<Resource> scripts) {
        String separator = env.getProperty(PREFIX + "separator", ";");
        String encoding = env.getProperty(PREFIX + "encoding");
        boolean continueOnError = env.getProperty(PREFIX + "continue-on-error", Boolean.class, false);
        Map<String, byte[]> files = new LinkedHashMap<>();
        for (int i = 0; i < scripts.size(); i++) {
            Resource r = scripts.get(i);
            try (InputStream in = r.getInputStream()) {
                // The order is part of the key: the same scripts in another order are another template.
                files.put(String.format("%04d-%s", i, r.getFilename()), in.readAllBytes());
            } catch (IOException e) {
                throw new UncheckedIOException("pgfork: reading " + r, e);
            }
        }
        String hash = TemplateHash.ofFiles(files, "spring.sql.init separator=" + separator + " encoding=" + encoding
                + " continue-on-error=" + continueOnError);
        return new Migrator() {
            @Override
            public String templateHash() {
                return hash;
            }

            @Override
            public void migrate(DatabaseConfig db) throws Exception {
                ResourceDatabasePopulator populator = new ResourceDatabasePopulator();
                populator.setSeparator(separator);
                populator.setContinueOnError(continueOnError);
                if (encoding != null) {
                    populator.setSqlScriptEncoding(encoding);
                }
                scripts.forEach(populator::addScript);
                try (Connection c = Migrators.connect(db)) {
                    populator.populate(c);
                }
            }

            @Override
            public String toString() {
                return "Spring SQL init scripts " + scripts.stream().map(Resource::getDescription).toList();
            }
        };
    }

    /** A list property as Boot binds it: comma-separated, or indexed ({@code name[0]}, {@code name[1]}, ...); null when unset. */
    private static List<String> locations(Environment env, String name) {
        String[] value = env.getProperty(name, String[].class);
        if (value != null) {
            return Arrays.stream(value).map(String::trim).filter(s -> !s.isEmpty()).toList();
        }
        List<String> indexed = new ArrayList<>();
        for (int i = 0; env.containsProperty(name + "[" + i + "]"); i++) {
            indexed.add(env.getProperty(name + "[" + i + "]").trim());
        }
        return indexed.isEmpty() ? null : indexed;
    }
}
