package io.pgfork;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.channels.FileChannel;
import java.nio.channels.FileLock;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.security.SecureRandom;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;

/**
 * Starts {@code pgfork serve} when no server is configured, as the Go, Python, JavaScript and Rust clients do: once
 * for all the test JVMs of a run (Surefire and Gradle forks share it through a lock in the state directory), on a
 * free loopback port with a random token, in a state directory of the project that survives the run so the next run
 * reuses its templates ({@link #stateDir()}). Each JVM holds a shared lock on the lease file while it lives; the
 * server exits when no JVM holds it any more.
 *
 * <p>The PostgreSQL major is the project's ({@link #pgMajor(String)}: {@code pgfork.pg} / {@code PGFORK_PG}, else
 * the Spring property {@code pgfork.pg}): a started server gets {@code --pg N} (serve installs a missing major), and
 * a running one of another major, or one whose major this launcher did not record, is not used.
 *
 * <p>A server is found one way (docs/SECURITY.md, rule 3): the one configured ({@code PGFORK_URL}), else the serve
 * that holds the state directory, proven by its own record ({@link ServeOwner}). Nothing that merely answers on a
 * port (the default one, or one a record names) is sent a request or a token, and the state directory must be this
 * user's alone: another user's could plant the records this class trusts.
 */
final class ServeLauncher {
    /** How long the first start may take: it may create the managed PostgreSQL cluster, or install PostgreSQL. */
    static final Duration START_TIMEOUT = Duration.ofMinutes(5);

    private static final ObjectMapper JSON = new ObjectMapper();
    private static FileChannel lease; // held until this JVM exits
    /** The PostgreSQL version of the server started or joined here ("" when not known). */
    private static volatile String pgVersion = "";

    private ServeLauncher() {
    }

    /**
     * The state directory a started server uses: {@code PGFORK_STATE_DIR} ({@code pgfork.state.dir}), else the
     * project's build directory: {@code build/pgfork} in a Gradle project (a build.gradle or build.gradle.kts and no
     * pom.xml in the working directory, which Gradle and Maven set to the project's), else {@code target/pgfork}. As
     * root, when the postgres OS user cannot reach the project (a directory above it without o+x, as /root is), the
     * project's own directory under pgfork's: {@code /var/lib/pgfork/projects/NAME-HASH}.
     */
    static Path stateDir() {
        String d = Settings.get("PGFORK_STATE_DIR");
        if (d != null) {
            return Path.of(d).toAbsolutePath();
        }
        Path project = Path.of("").toAbsolutePath();
        if (isRoot() && !reachableByOthers(project)) {
            String hash = HexFormat.of().formatHex(sha256(project.toString())).substring(0, 12);
            String name = project.getFileName() == null ? "root" : project.getFileName().toString();
            return Path.of("/var/lib/pgfork", "projects", name + "-" + hash);
        }
        boolean gradle = !Files.exists(project.resolve("pom.xml"))
                && (Files.exists(project.resolve("build.gradle")) || Files.exists(project.resolve("build.gradle.kts")));
        return project.resolve(gradle ? "build" : "target").resolve("pgfork");
    }

    private static boolean isRoot() {
        try {
            return ServeOwner.myUid() == 0;
        } catch (IOException | UnsupportedOperationException e) {
            return false;
        }
    }

    /** Whether every existing directory from / down to dir lets others pass (o+x). */
    private static boolean reachableByOthers(Path dir) {
        for (Path d = dir; d != null; d = d.getParent()) {
            try {
                int mode = (Integer) Files.getAttribute(d, "unix:mode");
                if ((mode & 0001) == 0) {
                    return false;
                }
            } catch (IOException | UnsupportedOperationException e) {
                // not made yet (made 0755), or no unix attributes: nothing to tell
            }
        }
        return true;
    }

    private static byte[] sha256(String s) {
        try {
            return java.security.MessageDigest.getInstance("SHA-256").digest(s.getBytes(StandardCharsets.UTF_8));
        } catch (java.security.NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }

    /**
     * The PostgreSQL major a started server runs: the JVM system property {@code pgfork.pg}, else the environment's
     * {@code PGFORK_PG} (they win, so a CI matrix can override a project's pin), else fallback (the Spring property
     * {@code pgfork.pg}); "" when none is set: serve's default, the newest PostgreSQL installed on the system.
     *
     * @param fallback the project's setting, or null
     * @return the major, e.g. "17", or ""
     * @throws PgforkException for anything but a major number
     */
    static String pgMajor(String fallback) {
        String v = Settings.get("PGFORK_PG");
        if (v == null) {
            v = fallback == null ? "" : fallback;
        }
        v = v.strip();
        if (!v.isEmpty() && !v.matches("[1-9][0-9]?")) {
            throw new PgforkException("pgfork: PGFORK_PG (pgfork.pg) = \"" + v
                    + "\" is not a PostgreSQL major version: give one such as 17", null);
        }
        return v;
    }

    /** @return the PostgreSQL version of the server started or joined in this JVM, e.g. "17.11" ("" when not known) */
    static String pgVersion() {
        return pgVersion;
    }

    /** @return the major of a PostgreSQL version such as "17.11" ("" when not known) */
    static String majorOf(String version) {
        java.util.regex.Matcher m = java.util.regex.Pattern.compile("^(\\d+)").matcher(version == null ? "" : version);
        return m.find() ? m.group(1) : "";
    }

    /**
     * The client to use: the configured server, a running started one, or a newly started one.
     *
     * @return the client
     */
    static PgforkClient client() {
        return client(null);
    }

    /**
     * The client to use: the configured server, a running started one, or a newly started one.
     *
     * @param major the project's PostgreSQL major (see {@link #pgMajor(String)}), or null
     * @return the client
     */
    static synchronized PgforkClient client(String major) {
        if (Settings.serverConfigured()) {
            return PgforkClient.fromEnvironment();
        }
        String want = pgMajor(major);
        Path dir = stateDir();
        try {
            privateDir(dir);
            takeLease(dir);
            try (FileChannel lockFile = FileChannel.open(dir.resolve("serve.lock"), StandardOpenOption.CREATE, StandardOpenOption.WRITE);
                 FileLock held = lockFile.lock()) {
                assert held.isValid();
                PgforkClient running = running(dir, want);
                if (running != null) {
                    return running;
                }
                return start(dir, want);
            }
        } catch (IOException e) {
            throw new UncheckedIOException("pgfork: starting pgfork serve in " + dir + ": " + e.getMessage(), e);
        }
    }

    private static void takeLease(Path dir) throws IOException {
        if (lease == null) {
            FileChannel ch = FileChannel.open(dir.resolve("lease"), StandardOpenOption.CREATE, StandardOpenOption.WRITE,
                    StandardOpenOption.READ);
            ch.lock(0, Long.MAX_VALUE, true); // released by the OS when this JVM exits
            lease = ch;
        }
    }

    /**
     * dir, created if missing (0755: the managed PostgreSQL runs as another user when the tests run as root), once it
     * is proven to be this user's alone: owned by this user, a directory, writable by no one else.
     */
    static void privateDir(Path dir) throws IOException {
        Files.createDirectories(dir);
        Object uid = Files.getAttribute(dir, "unix:uid", java.nio.file.LinkOption.NOFOLLOW_LINKS);
        int mode = (Integer) Files.getAttribute(dir, "unix:mode", java.nio.file.LinkOption.NOFOLLOW_LINKS);
        if (!Files.isDirectory(dir, java.nio.file.LinkOption.NOFOLLOW_LINKS)
                || ((Number) uid).longValue() != ServeOwner.myUid() || (mode & 0022) != 0) {
            throw new PgforkException("pgfork: the state directory " + dir + " is not this user's alone (owner uid " + uid
                    + ", mode " + Integer.toOctalString(mode & 07777) + "): pgfork keeps records there it trusts; set"
                    + " PGFORK_STATE_DIR to a directory you own that others cannot write", null);
        }
    }

    /**
     * The server another JVM of this run started: the serve holding the state directory, proven by its own record
     * ({@link ServeOwner}), with the token this launcher recorded for it in serve.json (0600, in a directory only
     * this user writes). A serve.json whose serve is gone, or whose port another process holds now, is not used.
     */
    static PgforkClient running(Path dir) throws IOException {
        return running(dir, "");
    }

    /**
     * {@link #running(Path)}, refusing it (a PgforkException saying how to go on) when want names a major and the
     * serve runs another, or its record does not say which.
     */
    static PgforkClient running(Path dir, String want) throws IOException {
        Path info = dir.resolve("serve.json");
        if (!Files.exists(info, java.nio.file.LinkOption.NOFOLLOW_LINKS)) {
            return null;
        }
        ServeOwner owner = ServeOwner.find(dir.resolve("state"));
        if (owner == null) {
            return null;
        }
        JsonNode j = JSON.readTree(info.toFile());
        String version = j.path("pg_version").asText("");
        if (!want.isEmpty() && !majorOf(version).equals(want)) {
            throw new PgforkException("pgfork: the pgfork serve holding the state directory " + dir + " (pid "
                    + owner.pid() + ") " + (version.isEmpty() ? "did not say which PostgreSQL it runs"
                    : "runs PostgreSQL " + version) + ", and PGFORK_PG (pgfork.pg) asks for " + want
                    + ": let the test run that started it end (its serve stops with it), or stop it (kill "
                    + owner.pid() + "); or give this run a state directory of its own (PGFORK_STATE_DIR); or set"
                    + " PGFORK_URL to use that server as it is", null);
        }
        pgVersion = version;
        return new PgforkClient(owner.url(), j.path("token").asText(null), Duration.ofMinutes(2));
    }

    static PgforkClient start(Path dir) throws IOException {
        return start(dir, "");
    }

    /** Starts serve in dir, with {@code --pg want} unless want is "". */
    static PgforkClient start(Path dir, String want) throws IOException {
        String bin = binary();
        String token = HexFormat.of().formatHex(random());
        Path out = dir.resolve("serve.out");
        Path log = dir.resolve("serve.log");
        Files.deleteIfExists(out);
        List<String> args = new ArrayList<>(List.of(bin, "serve", "--listen", "127.0.0.1:0", "--json",
                "--state-dir", dir.resolve("state").toString()));
        if (!want.isEmpty()) {
            args.addAll(List.of("--pg", want));
        }
        boolean leased = supportsLease(bin);
        if (leased) {
            args.addAll(List.of("--lease", dir.resolve("lease").toString()));
        }
        args.addAll(ServeArgs.fromEnv());
        ProcessBuilder pb = new ProcessBuilder(args).redirectOutput(out.toFile())
                .redirectError(ProcessBuilder.Redirect.appendTo(log.toFile()))
                .redirectInput(ProcessBuilder.Redirect.from(new File("/dev/null")));
        pb.environment().put("PGFORK_TOKEN", token); // not on the command line, where ps shows it
        Process p = pb.start();
        if (!leased) {
            Runtime.getRuntime().addShutdownHook(new Thread(p::destroy));
        }
        long deadline = System.nanoTime() + START_TIMEOUT.toNanos();
        while (System.nanoTime() < deadline) {
            JsonNode line = serveLine(out);
            String listen = line == null ? null : line.path("listen").asText(null);
            if (listen != null) {
                PgforkClient c = new PgforkClient("http://" + listen, token, Duration.ofMinutes(2));
                if (c.healthy()) {
                    pgVersion = line.path("pg_version").asText("");
                    Path tmp = dir.resolve("serve.json.tmp");
                    Files.deleteIfExists(tmp);
                    Files.createFile(tmp, PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rw-------")));
                    Files.writeString(tmp, JSON.writeValueAsString(Map.of("url", "http://" + listen, "token", token,
                            "pid", p.pid(), "pg_version", pgVersion)));
                    Files.move(tmp, dir.resolve("serve.json"), java.nio.file.StandardCopyOption.ATOMIC_MOVE,
                            java.nio.file.StandardCopyOption.REPLACE_EXISTING);
                    return c;
                }
            }
            if (!p.isAlive()) {
                break;
            }
            try {
                Thread.sleep(100);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                p.destroy();
                throw new PgforkException("pgfork: interrupted while starting pgfork serve", e);
            }
        }
        p.destroy();
        String tail = Files.exists(log) ? Files.readString(log, StandardCharsets.UTF_8) : "";
        tail = tail.length() > 2000 ? tail.substring(tail.length() - 2000) : tail;
        throw new PgforkException("pgfork: `" + bin + " serve` did not come up within " + START_TIMEOUT.toSeconds()
                + " s (its log, " + log + "):\n" + tail, null);
    }

    private static byte[] random() {
        byte[] b = new byte[24];
        new SecureRandom().nextBytes(b);
        return b;
    }

    /** serve's --json line (where it listens, the PostgreSQL it runs), or null while it has not written it whole. */
    private static JsonNode serveLine(Path out) throws IOException {
        if (!Files.exists(out)) {
            return null;
        }
        for (String line : Files.readAllLines(out, StandardCharsets.UTF_8)) {
            if (line.startsWith("{")) {
                try {
                    JsonNode j = JSON.readTree(line);
                    if (!j.path("listen").asText("").isEmpty()) {
                        return j;
                    }
                } catch (IOException partial) {
                    return null; // written halfway: read again
                }
            }
        }
        return null;
    }

    private static boolean supportsLease(String bin) {
        try {
            Process p = new ProcessBuilder(bin, "serve", "--help").redirectErrorStream(true).start();
            String help = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
            p.waitFor();
            return help.contains("--lease");
        } catch (IOException e) {
            return false;
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return false;
        }
    }

    /** PGFORK_BIN, else pgfork on PATH; else an error that says how to get it. */
    static String binary() {
        String bin = Settings.get("PGFORK_BIN");
        if (bin != null) {
            if (!Files.isExecutable(Path.of(bin))) {
                throw new PgforkException("pgfork: PGFORK_BIN=" + bin + " is not an executable file", null);
            }
            return bin;
        }
        String path = System.getenv("PATH");
        if (path != null) {
            for (String d : path.split(File.pathSeparator)) {
                Path p = Path.of(d.isEmpty() ? "." : d, "pgfork");
                if (Files.isExecutable(p) && !Files.isDirectory(p)) {
                    return p.toString();
                }
            }
        }
        throw new PgforkException("pgfork: no server is configured (PGFORK_URL)"
                + " and no pgfork binary was found to start one: download the release tarball for this platform"
                + " (pgfork-VERSION-OS-ARCH.tar.gz) and put pgfork on PATH or set PGFORK_BIN, or set PGFORK_URL to a"
                + " running pgfork serve", null);
    }
}
