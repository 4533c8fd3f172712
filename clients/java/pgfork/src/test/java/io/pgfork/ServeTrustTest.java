package io.pgfork;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Rule 3 of docs/SECURITY.md for the Java glue: a server is used only when configured or proven to hold the state
 * directory. A record that outlived its serve, and a port that now answers for someone else, get no request.
 */
class ServeTrustTest {
    /** A server that answers every request 200 and keeps what it was sent (the Authorization header). */
    static final class Fake implements AutoCloseable {
        final HttpServer http;
        final List<String> got = new CopyOnWriteArrayList<>();

        Fake(int port) throws IOException {
            http = HttpServer.create(new InetSocketAddress(InetAddress.getLoopbackAddress(), port), 0);
            http.createContext("/", ex -> {
                got.add(ex.getRequestMethod() + " " + ex.getRequestURI() + " " + ex.getRequestHeaders().getFirst("Authorization"));
                byte[] b = "{\"status\":\"ok\"}".getBytes();
                ex.sendResponseHeaders(200, b.length);
                ex.getResponseBody().write(b);
                ex.close();
            });
            http.start();
        }

        String url() {
            return "http://127.0.0.1:" + http.getAddress().getPort();
        }

        @Override
        public void close() {
            http.stop(0);
        }
    }

    @Test
    void aRecordWhoseServeIsGoneIsNotUsed(@TempDir Path dir) throws Exception {
        try (Fake fake = new Fake(0)) {
            // serve.json of a serve that exited (or was killed): its port answers now for another process.
            Files.writeString(dir.resolve("serve.json"), "{\"url\":\"" + fake.url() + "\",\"token\":\"the-run-token-0123456789\"}");
            assertNull(ServeLauncher.running(dir), "no serve holds the state directory: nothing to use");
            assertEquals(List.of(), fake.got, "the port a stale record names was sent nothing, the token least of all");
        }
    }

    @Test
    void aRecordOfAServeNotHoldingItsLockIsNotUsed(@TempDir Path dir) throws Exception {
        try (Fake fake = new Fake(0)) {
            Files.writeString(dir.resolve("serve.json"), "{\"url\":\"" + fake.url() + "\",\"token\":\"the-run-token-0123456789\"}");
            // A record naming this very process (alive, this user, its start time) and the fake's address, but no
            // flock held on serve.lock: not a serve holding the state directory.
            Path locks = Files.createDirectories(dir.resolve("state").resolve("locks"));
            Files.createFile(locks.resolve("serve.lock"));
            long pid = ProcessHandle.current().pid();
            Files.writeString(locks.resolve("serve.owner"), "{\"pid\":" + pid + ",\"start\":" + ServeOwner.startTime(pid)
                    + ",\"uid\":" + ServeOwner.myUid() + ",\"listen\":\"127.0.0.1:" + fake.http.getAddress().getPort() + "\"}");
            assertNull(ServeOwner.find(dir.resolve("state")));
            assertNull(ServeLauncher.running(dir));
            assertEquals(List.of(), fake.got);
        }
    }

    @Test
    void aStateDirectoryOthersCanWriteIsRefused(@TempDir Path dir) throws Exception {
        Path shared = Files.createDirectory(dir.resolve("shared"));
        Files.setPosixFilePermissions(shared, PosixFilePermissions.fromString("rwxrwxrwx"));
        PgforkException e = assertThrows(PgforkException.class, () -> ServeLauncher.privateDir(shared));
        assertTrue(e.getMessage().contains("not this user's alone"), e.getMessage());
        Path mine = dir.resolve("mine");
        ServeLauncher.privateDir(mine); // created, this user's, 0755 at most
        assertTrue(Files.isDirectory(mine));
    }
}
