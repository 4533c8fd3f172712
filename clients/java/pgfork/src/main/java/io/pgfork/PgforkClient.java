package io.pgfork;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.HttpURLConnection;
import java.net.URI;
import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;

/**
 * A client of {@code pgfork serve}'s native API (/api/v2), or of IntegreSQL's /api/v1 when the base URL ends in
 * {@code /api/v1}. Thread-safe. The base URL may carry a token as its path ({@code http://host:port/TOKEN/api}, as
 * IntegreSQL's clients spell it); errors always show it masked.
 *
 * <p>Requests go through {@link HttpURLConnection} (kept-alive connections), not {@code java.net.http.HttpClient}:
 * building an HttpClient initializes the JVM's default TLS context (the CA certificates) and its first request starts
 * a selector thread, about a second of CPU in every test JVM before its first test, for a server on plain HTTP.
 */
public final class PgforkClient {
    /** The base URL clients use when nothing else is configured (IntegreSQL's default port). */
    public static final String DEFAULT_URL = "http://127.0.0.1:5000";

    private static final ObjectMapper JSON = new ObjectMapper();
    private static final int CONNECT_TIMEOUT_MS = 5000;

    private final String baseUrl;
    private final String token;
    private final int apiVersion;
    private final Duration timeout;

    /**
     * A client of the server at baseUrl.
     *
     * @param baseUrl {@code http(s)://host:port}, optionally ending in /api, /api/v2 or /api/v1 (IntegreSQL)
     * @param token a Bearer token, or null
     * @param timeout bound of each request (a test database request may wait for a template build)
     */
    public PgforkClient(String baseUrl, String token, Duration timeout) {
        URI u;
        try {
            u = URI.create(baseUrl);
        } catch (IllegalArgumentException e) {
            throw new PgforkException("pgfork: base URL " + maskBaseUrl(baseUrl) + " is not a URL; want http://HOST:PORT", e);
        }
        if (!("http".equals(u.getScheme()) || "https".equals(u.getScheme())) || u.getHost() == null) {
            throw new PgforkException("pgfork: base URL " + maskBaseUrl(baseUrl) + " must be http(s)://HOST:PORT", null);
        }
        String path = u.getRawPath() == null ? "" : u.getRawPath().replaceAll("/+$", "");
        int version = path.endsWith("/api/v1") ? 1 : 2;
        for (String suffix : new String[] {"/v1", "/v2", "/api"}) {
            if (path.endsWith(suffix)) {
                path = path.substring(0, path.length() - suffix.length());
            }
        }
        this.baseUrl = u.getScheme() + "://" + u.getRawAuthority() + path;
        this.token = token == null || token.isEmpty() ? null : token;
        this.apiVersion = version;
        this.timeout = timeout;
    }

    /**
     * A client configured as every pgfork client is: {@code PGFORK_URL}, else {@code INTEGRESQL_CLIENT_BASE_URL},
     * else {@link #DEFAULT_URL}; the token from {@code PGFORK_TOKEN}.
     *
     * @return the client
     */
    public static PgforkClient fromEnvironment() {
        return new PgforkClient(Settings.serverUrl(), Settings.token(), Duration.ofMinutes(2));
    }

    /** @return the base URL, token included when it has one in its path: do not print it, use {@link #maskedBaseUrl()} */
    public String baseUrl() {
        return baseUrl;
    }

    /** @return the base URL as errors show it: a token or password in it replaced by {@code ***} */
    public String maskedBaseUrl() {
        return maskBaseUrl(baseUrl);
    }

    /** @return 2 for pgfork's API, 1 for IntegreSQL's */
    public int apiVersion() {
        return apiVersion;
    }

    /**
     * A base URL as errors show it: what can carry a secret replaced by {@code ***} (a userinfo, the path, where
     * pgfork serve takes its token as the first segment, a query and a fragment); scheme, host and port stay.
     *
     * @param url the URL
     * @return the masked URL
     */
    public static String maskBaseUrl(String url) {
        if (url == null) {
            return "";
        }
        URI u;
        try {
            u = new URI(url);
        } catch (java.net.URISyntaxException e) {
            return "***";
        }
        if (u.getScheme() == null) {
            return "***";
        }
        String authority = u.getRawAuthority() == null ? "" : u.getRawAuthority();
        int at = authority.lastIndexOf('@');
        if (at >= 0) {
            authority = "***@" + authority.substring(at + 1);
        }
        String path = u.getRawPath() == null ? "" : u.getRawPath();
        StringBuilder sb = new StringBuilder(u.getScheme()).append("://").append(authority);
        if (!path.replace("/", "").isEmpty()) {
            sb.append("/***");
        }
        if (u.getRawQuery() != null && !u.getRawQuery().isEmpty()) {
            sb.append("?***");
        }
        if (u.getRawFragment() != null && !u.getRawFragment().isEmpty()) {
            sb.append("#***");
        }
        return sb.toString();
    }

    /** @return true if GET /healthz answers 200 */
    public boolean healthy() {
        try {
            request("healthy", "GET", "/healthz", null, 200, Duration.ofSeconds(2));
            return true;
        } catch (PgforkException e) {
            return false;
        }
    }

    /** @return true if anything answers HTTP at the base URL (IntegreSQL has no /healthz) */
    public boolean reachable() {
        try {
            request("reachable", "GET", "/healthz", null, 200, Duration.ofSeconds(2));
        } catch (PgforkException e) {
            return !e.isUnreachable();
        }
        return true;
    }

    /**
     * Registers a template; this caller migrates the returned database, then calls {@link #finalizeTemplate}.
     *
     * @param hash the template hash
     * @return the empty template database
     * @throws PgforkException with {@link PgforkException#isTemplateTaken()} when another caller builds it
     */
    public TemplateDatabase initializeTemplate(String hash) {
        JsonNode body = request("initializeTemplate", "POST", api() + "/templates", Map.of("hash", hash), 200, timeout);
        JsonNode db = body.path("database");
        String h = text(body, "templateHash", text(db, "templateHash", hash));
        return new TemplateDatabase(h, config(db.path("config")));
    }

    /**
     * Marks the template ready: test databases are copied from it from now on.
     *
     * @param hash the template hash
     */
    public void finalizeTemplate(String hash) {
        request("finalizeTemplate", "PUT", api() + "/templates/" + enc(hash), null, 204, timeout);
    }

    /**
     * Drops the template (after a failed migration); callers waiting for it get an error.
     *
     * @param hash the template hash
     */
    public void discardTemplate(String hash) {
        request("discardTemplate", "DELETE", api() + "/templates/" + enc(hash), null, 204, timeout);
    }

    /**
     * A fresh test database; the server waits for the template to be finalized and for a ready copy.
     *
     * @param hash the template hash
     * @return the test database, this caller's until given back
     */
    public TestDatabase getTestDatabase(String hash) {
        JsonNode body = request("getTestDatabase", "GET", api() + "/templates/" + enc(hash) + "/tests", null, 200, timeout);
        JsonNode db = body.path("database");
        String h = text(body, "templateHash", text(db, "templateHash", hash));
        DatabaseConfig cfg = config(db.path("config"));
        if (body.path("id").isTextual()) {
            return new TestDatabase(h, body.path("number").asInt(), body.path("id").asText(), cfg);
        }
        return new TestDatabase(h, body.path("id").asInt(), null, cfg);
    }

    /**
     * Gives a database back to be recreated from its template (after a test that wrote).
     *
     * @param db the database
     */
    public void recreate(TestDatabase db) {
        handOutOp("recreate", db);
    }

    /**
     * Gives a database back unchanged (only after a test that did not write).
     *
     * @param db the database
     */
    public void unlock(TestDatabase db) {
        handOutOp("unlock", db);
    }

    private void handOutOp(String op, TestDatabase db) {
        String path = apiVersion == 1 || db.token() == null
                ? "/api/v1/templates/" + enc(db.templateHash()) + "/tests/" + db.id() + "/" + op
                : "/api/v2/templates/" + enc(db.templateHash()) + "/tests/" + enc(db.token()) + "/" + op;
        request(op, "POST", path, null, 204, timeout);
    }

    private String api() {
        return "/api/v" + apiVersion;
    }

    private JsonNode request(String op, String method, String path, Object body, int want, Duration t) {
        try {
            HttpURLConnection c = (HttpURLConnection) URI.create(baseUrl + path).toURL().openConnection();
            c.setConnectTimeout(CONNECT_TIMEOUT_MS);
            c.setReadTimeout((int) Math.min(Integer.MAX_VALUE, Math.max(1, t.toMillis())));
            c.setUseCaches(false);
            c.setRequestMethod(method);
            c.setRequestProperty("Accept", "application/json");
            if (token != null) {
                c.setRequestProperty("Authorization", "Bearer " + token);
            }
            if (body != null || "POST".equals(method) || "PUT".equals(method)) {
                byte[] out = body == null ? new byte[0] : JSON.writeValueAsBytes(body);
                if (body != null) {
                    c.setRequestProperty("Content-Type", "application/json");
                }
                c.setDoOutput(true);
                c.setFixedLengthStreamingMode(out.length);
                try (OutputStream o = c.getOutputStream()) {
                    o.write(out);
                }
            }
            int status = c.getResponseCode();
            String raw;
            // Read to the end and close, so the connection goes back to the keep-alive cache.
            try (InputStream in = status >= 400 ? c.getErrorStream() : c.getInputStream()) {
                raw = in == null ? "" : new String(in.readAllBytes(), StandardCharsets.UTF_8).strip();
            }
            if (status != want) {
                String message = raw;
                try {
                    JsonNode j = JSON.readTree(raw);
                    if (j != null && j.isObject()) {
                        message = text(j, "message", text(j, "error", raw));
                    }
                } catch (IOException notJson) {
                    // the body as it came
                }
                if (message.length() > 300) {
                    message = message.substring(0, 300);
                }
                throw new PgforkException("pgfork: " + op + ": " + status + " " + mask(message)
                        + advice(status), status, false, null);
            }
            return raw.isEmpty() ? JSON.createObjectNode() : JSON.readTree(raw);
        } catch (IOException e) {
            throw new PgforkException("pgfork: " + op + ": no answer from " + maskedBaseUrl()
                    + " (is `pgfork serve` running? set PGFORK_URL to point at one): " + mask(String.valueOf(e.getMessage())),
                    0, true, null);
        }
    }

    private static String advice(int status) {
        return switch (status) {
            case 401, 403 -> " (check PGFORK_TOKEN: the server wants its token)";
            case 503 -> " (no database was ready in time: raise serve's --get-timeout or --pool-max)";
            case 507 -> " (the server's disk is full)";
            default -> "";
        };
    }

    private String mask(String text) {
        return text.replace(baseUrl, maskedBaseUrl());
    }

    private static DatabaseConfig config(JsonNode c) {
        Map<String, String> params = new HashMap<>();
        for (Map.Entry<String, JsonNode> e : c.path("additionalParams").properties()) {
            params.put(e.getKey(), e.getValue().asText());
        }
        return new DatabaseConfig(c.path("host").asText(""), c.path("port").asInt(0), c.path("username").asText(""),
                c.path("password").asText(""), c.path("database").asText(""), params);
    }

    private static String text(JsonNode n, String field, String otherwise) {
        JsonNode v = n.get(field);
        return v != null && v.isTextual() && !v.asText().isEmpty() ? v.asText() : otherwise;
    }

    private static String enc(String s) {
        return URLEncoder.encode(s, StandardCharsets.UTF_8).replace("+", "%20");
    }

    @Override
    public String toString() {
        return "PgforkClient[" + maskedBaseUrl() + "]";
    }
}
