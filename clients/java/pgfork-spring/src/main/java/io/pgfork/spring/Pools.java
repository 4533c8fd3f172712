package io.pgfork.spring;

import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.util.Locale;
import java.util.Set;
import java.util.function.Function;
import javax.sql.DataSource;

/** A connection pool for a test context: HikariCP when the application has it (Spring Boot's default). */
final class Pools {
    static final boolean HIKARI = Classpath.has("com.zaxxer.hikari.HikariDataSource");

    private Pools() {
    }

    /**
     * A Hikari pool over target, whose connections go to the context's current copy. One pool serves every copy of a
     * context: a refresh evicts the old copy's connections and the pool opens its next ones to the new copy.
     * Measured (issue 36), a pool per copy cost each copy its start (threads, the fail-fast check) and its close: 31.5
     * ms to start with a first connection against 19.9 ms for the connection alone, p50, and 5.6 ms to close.
     */
    static HikariDataSource hikari(DataSource target, String name, Function<String, String> settings) {
        HikariDataSource h = new HikariDataSource();
        h.setMaximumPoolSize(4);
        // One idle connection: after a refresh evicts the old copy's, the pool opens one to the new copy at once,
        // before the next test asks (the copy made ready ahead has it open already).
        h.setMinimumIdle(1);
        h.setPoolName(name);
        applySettings(h, settings);
        h.setDataSource(target);
        return h;
    }

    /** The application's pool settings: Spring Boot binds them to its own Hikari pool, as HikariConfig's setters. */
    static final String HIKARI_PREFIX = "spring.datasource.hikari.";

    /**
     * HikariConfig's properties that say where connections come from: pgfork's pool takes them from the current copy,
     * so these of the application's settings do not apply (Hikari would use them only when it makes the DataSource).
     */
    private static final Set<String> WHERE_FROM = Set.of("dataSource", "dataSourceClassName", "dataSourceJNDI",
            "dataSourceProperties", "driverClassName", "jdbcUrl", "username", "password", "credentials");

    /**
     * Sets on h every scalar HikariConfig property (int, long, boolean, String) the application sets under
     * {@code spring.datasource.hikari.}, in Spring Boot's kebab-case ({@code maximum-pool-size}) or as the property is
     * named ({@code maximumPoolSize}): pool size, minimum idle, auto-commit, connection-init-sql, schema, timeouts,
     * transaction isolation, read-only… as Boot's binding would, so the application behaves under pgfork as without it.
     * A value that does not convert fails the context with the property's name.
     */
    static void applySettings(HikariConfig h, Function<String, String> settings) {
        if (settings == null) {
            return;
        }
        for (Method m : HikariConfig.class.getMethods()) {
            if (!m.getName().startsWith("set") || m.getParameterCount() != 1 || Modifier.isStatic(m.getModifiers())) {
                continue;
            }
            String prop = Character.toLowerCase(m.getName().charAt(3)) + m.getName().substring(4);
            if (WHERE_FROM.contains(prop)) {
                continue;
            }
            String key = HIKARI_PREFIX + kebab(prop);
            String value = settings.apply(key);
            if (value == null) {
                value = settings.apply(HIKARI_PREFIX + prop);
            }
            if (value == null) {
                continue;
            }
            Class<?> type = m.getParameterTypes()[0];
            try {
                Object v = type == int.class ? Integer.valueOf(value.trim())
                        : type == long.class ? Long.valueOf(value.trim())
                        : type == boolean.class ? parseBoolean(key, value)
                        : type == String.class ? value : null;
                if (v != null) {
                    m.invoke(h, v);
                }
            } catch (NumberFormatException e) {
                throw new IllegalArgumentException("pgfork: " + key + "=" + value + " is not a number", e);
            } catch (IllegalAccessException e) {
                throw new IllegalStateException("pgfork: setting " + key + ": " + e, e);
            } catch (InvocationTargetException e) {
                throw new IllegalArgumentException("pgfork: " + key + "=" + value + ": " + e.getCause().getMessage(), e.getCause());
            }
        }
    }

    private static boolean parseBoolean(String key, String value) {
        return switch (value.trim().toLowerCase(Locale.ROOT)) {
            case "true" -> true;
            case "false" -> false;
            default -> throw new IllegalArgumentException("pgfork: " + key + "=" + value + " is not true or false");
        };
    }

    /** maximumPoolSize → maximum-pool-size. */
    static String kebab(String camel) {
        StringBuilder b = new StringBuilder(camel.length() + 4);
        for (char c : camel.toCharArray()) {
            if (Character.isUpperCase(c)) {
                b.append('-').append(Character.toLowerCase(c));
            } else {
                b.append(c);
            }
        }
        return b.toString();
    }

    /** Evicts conn, borrowed from a Hikari pool, from it (closed, not handed out again). */
    static void evict(AutoCloseable pool, java.sql.Connection conn) throws java.sql.SQLException {
        if (pool instanceof HikariDataSource h) {
            h.evictConnection(conn);
        } else {
            conn.close();
        }
    }

    /**
     * Stops (on false) or restarts (on true) a Hikari pool's filling itself up to its minimum of idle connections,
     * which would take a copy for a context that waits between test classes. The pool's own minimum comes back on
     * true; Hikari takes both at run time.
     */
    static void fill(AutoCloseable pool, boolean on) {
        if (pool instanceof HikariDataSource h) {
            synchronized (MIN_IDLE) {
                if (on) {
                    Integer was = MIN_IDLE.remove(h);
                    if (was != null) {
                        h.getHikariConfigMXBean().setMinimumIdle(was);
                    }
                } else if (!MIN_IDLE.containsKey(h)) {
                    MIN_IDLE.put(h, h.getMinimumIdle());
                    h.getHikariConfigMXBean().setMinimumIdle(0);
                }
            }
        }
    }

    /** Each paused pool's own minimum of idle connections. */
    private static final java.util.Map<HikariDataSource, Integer> MIN_IDLE = new java.util.WeakHashMap<>();

    /** Evicts every connection of a Hikari pool: idle ones are closed now, those in use when they come back. */
    static void evictAll(AutoCloseable pool) {
        if (pool instanceof HikariDataSource h && h.getHikariPoolMXBean() != null) {
            h.getHikariPoolMXBean().softEvictConnections();
        }
    }
}
