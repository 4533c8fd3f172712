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
 * Starts {@code pgfork serve} when no server is configured and none answers, as the Go, Python, JavaScript and Rust
 * clients do: once for all the test JVMs of a run (Surefire and Gradle forks share it through a lock in the state
 * directory), on a free loopback port with a random token, in a state directory that survives the run so the next
 * run reuses its templates ({@code PGFORK_STATE_DIR}, else {@code target/pgfork}). Each JVM holds a shared lock on
 * the lease file while it lives; the server exits when no JVM holds it any more.
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
        PgforkClient configured = PgforkClient.fromEnvironment();
        if (Settings.serverConfigured() || configured.reachable()) {
            return configured;
        }
        Path dir = stateDir();
        try {
            Files.createDirectories(dir);
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

    /** The server another JVM of this run started, if it still answers. */
    private static PgforkClient running(Path dir) throws IOException {
        Path info = dir.resolve("serve.json");
        if (!Files.exists(info)) {
            return null;
        }
        JsonNode j = JSON.readTree(info.toFile());
        PgforkClient c = new PgforkClient(j.path("url").asText(), j.path("token").asText(null), Duration.ofMinutes(2));
        return c.healthy() ? c : null;
    }

    private static PgforkClient start(Path dir) throws IOException {
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
        throw new PgforkException("pgfork: no server answers at " + PgforkClient.maskBaseUrl(Settings.serverUrl())
                + " and no pgfork binary was found to start one: download the release tarball for this platform"
                + " (pgfork-VERSION-OS-ARCH.tar.gz) and put pgfork on PATH or set PGFORK_BIN, or set PGFORK_URL to a"
                + " running pgfork serve", null);
    }
}
