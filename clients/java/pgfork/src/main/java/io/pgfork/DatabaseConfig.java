package io.pgfork;

import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.TreeMap;

/**
 * How to connect to one database, as the server sends it. {@link #toString()} never shows the
 * password (it ends up in assertion messages and logs); {@link #jdbcUrl()} carries none either:
 * pass {@link #username()} and {@link #password()} separately, as JDBC drivers and pools expect.
 *
 * @param host host name or IP address (a path for a Unix socket directory)
 * @param port TCP port
 * @param username role to connect as
 * @param password its password (may be empty)
 * @param database database name
 * @param additionalParams extra connection parameters the server asks for
 */
public record DatabaseConfig(String host, int port, String username, String password, String database,
                             Map<String, String> additionalParams) {

    /** A copy of the parameters, so a record built from the server's answer cannot change. */
    public DatabaseConfig {
        additionalParams = additionalParams == null ? Map.of() : Map.copyOf(additionalParams);
    }

    /**
     * A JDBC URL for the PostgreSQL driver, {@code jdbc:postgresql://host:port/database?…}, without the user
     * and password ({@code sslmode=disable} unless the server says otherwise).
     *
     * @return the URL
     */
    public String jdbcUrl() {
        Map<String, String> q = new TreeMap<>(additionalParams);
        q.putIfAbsent("sslmode", "disable");
        String h = host.contains(":") ? "[" + host + "]" : host;
        StringBuilder sb = new StringBuilder("jdbc:postgresql://");
        if (host.startsWith("/")) {
            // A Unix socket directory: the driver needs a socket factory; give the host as a parameter.
            sb.append("localhost");
            q.put("host", host);
        } else {
            sb.append(h);
        }
        if (port != 0) {
            sb.append(':').append(port);
        }
        sb.append('/').append(enc(database));
        char sep = '?';
        for (Map.Entry<String, String> e : q.entrySet()) {
            sb.append(sep).append(enc(e.getKey())).append('=').append(enc(e.getValue()));
            sep = '&';
        }
        return sb.toString();
    }

    /**
     * A {@code postgres://user:password@host:port/database} URL with the password in it, for tools that take one
     * (psql, other languages). Do not print it: {@link #toString()} is the printable form.
     *
     * @return the URL with its password
     */
    public String url() {
        Map<String, String> q = new TreeMap<>(additionalParams);
        q.putIfAbsent("sslmode", "disable");
        StringBuilder sb = new StringBuilder("postgres://").append(enc(username));
        if (!password.isEmpty()) {
            sb.append(':').append(enc(password));
        }
        sb.append('@').append(host.contains(":") ? "[" + host + "]" : host);
        if (port != 0) {
            sb.append(':').append(port);
        }
        sb.append('/').append(enc(database));
        char sep = '?';
        for (Map.Entry<String, String> e : q.entrySet()) {
            sb.append(sep).append(enc(e.getKey())).append('=').append(enc(e.getValue()));
            sep = '&';
        }
        return sb.toString();
    }

    /** The URL with its password masked: {@code postgres://user:***@host:port/db?…}. */
    @Override
    public String toString() {
        return password.isEmpty() ? url() : url().replace(":" + enc(password) + "@", ":***@");
    }

    private static String enc(String s) {
        return URLEncoder.encode(s, StandardCharsets.UTF_8).replace("+", "%20");
    }
}
