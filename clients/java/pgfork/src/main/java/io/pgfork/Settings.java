package io.pgfork;

import java.util.Map;

/**
 * The settings every pgfork client reads, in one place: {@code PGFORK_URL} (else {@code INTEGRESQL_CLIENT_BASE_URL},
 * else {@link PgforkClient#DEFAULT_URL}), {@code PGFORK_TOKEN}, {@code PGFORK_BIN}, {@code PGFORK_STATE_DIR}. A JVM
 * system property of the same name in lower case with dots ({@code pgfork.url}, …) wins over the environment, so
 * Maven and Gradle can pass them.
 */
public final class Settings {
    private Settings() {
    }

    private static final Map<String, String> ENV = System.getenv();

    static String get(String name) {
        String prop = System.getProperty(name.toLowerCase(java.util.Locale.ROOT).replace('_', '.'));
        if (prop != null && !prop.isEmpty()) {
            return prop;
        }
        String v = ENV.get(name);
        return v == null || v.isEmpty() ? null : v;
    }

    /** @return true when the user named a server (so none is started for them) */
    public static boolean serverConfigured() {
        return get("PGFORK_URL") != null || get("INTEGRESQL_CLIENT_BASE_URL") != null;
    }

    /** @return the server's base URL */
    public static String serverUrl() {
        String u = get("PGFORK_URL");
        if (u == null) {
            u = get("INTEGRESQL_CLIENT_BASE_URL");
        }
        return u == null ? PgforkClient.DEFAULT_URL : u;
    }

    /** @return the server's token, or null */
    public static String token() {
        return get("PGFORK_TOKEN");
    }
}
