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
 * free loopback port with a random token, in a state directory that survives the run so the next run reuses its
 * templates ({@code PGFORK_STATE_DIR}, else {@code target/pgfork}). Each JVM holds a shared lock on the lease file
 * while it lives; the server exits when no JVM holds it any more.
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

    private ServeLauncher() {
    }

    /** The state directory a started server uses. */
    static Path stateDir() {
        String d = Settings.get("PGFORK_STATE_DIR");
        return (d != null ? Path.of(d) : Path.of("target", "pgfork")).toAbsolutePath();
    }

    /**
     * The client to use: the configured server, a running started one, or a newly started one.
     *
     * @return the client
     */
    static synchronized PgforkClient client() {
        if (Settings.serverConfigured()) {
            return PgforkClient.fromEnvironment();
        }
        Path dir = stateDir();
        try {
            privateDir(dir);
            takeLease(dir);
            try (FileChannel lockFile = FileChannel.open(dir.resolve("serve.lock"), StandardOpenOption.CREATE, StandardOpenOption.WRITE);
                 FileLock held = lockFile.lock()) {
                assert held.isValid();
                PgforkClient running = running(dir);
                if (running != null) {
                    return running;
                }
                return start(dir);
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
        Path info = dir.resolve("serve.json");
        if (!Files.exists(info, java.nio.file.LinkOption.NOFOLLOW_LINKS)) {
            return null;
        }
        ServeOwner owner = ServeOwner.find(dir.resolve("state"));
        if (owner == null) {
            return null;
        }
        JsonNode j = JSON.readTree(info.toFile());
        return new PgforkClient(owner.url(), j.path("token").asText(null), Duration.ofMinutes(2));
    }

    static PgforkClient start(Path dir) throws IOException {
        String bin = binary();
        String token = HexFormat.of().formatHex(random());
        Path out = dir.resolve("serve.out");
        Path log = dir.resolve("serve.log");
        Files.deleteIfExists(out);
        List<String> args = new ArrayList<>(List.of(bin, "serve", "--listen", "127.0.0.1:0", "--json",
                "--state-dir", dir.resolve("state").toString()));
        boolean leased = supportsLease(bin);
        if (leased) {
            args.addAll(List.of("--lease", dir.resolve("lease").toString()));
        }
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
            String listen = listenAddress(out);
            if (listen != null) {
                PgforkClient c = new PgforkClient("http://" + listen, token, Duration.ofMinutes(2));
                if (c.healthy()) {
                    Path tmp = dir.resolve("serve.json.tmp");
                    Files.deleteIfExists(tmp);
                    Files.createFile(tmp, PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rw-------")));
                    Files.writeString(tmp, JSON.writeValueAsString(Map.of("url", "http://" + listen, "token", token)));
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

    private static String listenAddress(Path out) throws IOException {
        if (!Files.exists(out)) {
            return null;
        }
        for (String line : Files.readAllLines(out, StandardCharsets.UTF_8)) {
            if (line.startsWith("{")) {
                try {
                    String l = JSON.readTree(line).path("listen").asText("");
                    if (!l.isEmpty()) {
                        return l;
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
