package io.pgfork;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;

/**
 * The {@code pgfork serve} that holds a state directory, proven as pgfork proves it (docs/SECURITY.md, rule 3: a
 * server is trusted only after it proves it is the one pgfork started; internal/servelock's Find): its record
 * {@code locks/serve.owner} names a pid that runs as this user with the recorded start time, and that pid holds the
 * flock on {@code locks/serve.lock}. A record outlives its serve (kill -9, a reboot) and the pid or loopback port it
 * names may be another user's by the time it is read: nothing that merely answers on a port is ever sent a request.
 * Outside Linux nothing can be proven, and no serve is found.
 *
 * @param pid the serve's process
 * @param url http://ADDRESS it listens on
 */
record ServeOwner(long pid, String url) {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final int MAX_RECORD = 4096;

    /**
     * @param state the serve's state directory ({@code --state-dir})
     * @return the serve holding it, proven, or null
     */
    static ServeOwner find(Path state) {
        try {
            Path locks = state.resolve("locks");
            JsonNode rec;
            try (InputStream in = Files.newInputStream(locks.resolve("serve.owner"), LinkOption.NOFOLLOW_LINKS)) {
                rec = JSON.readTree(new String(in.readNBytes(MAX_RECORD), StandardCharsets.UTF_8));
            }
            long pid = rec.path("pid").asLong(0);
            long start = rec.path("start").asLong(0);
            long uid = rec.path("uid").asLong(-1);
            String listen = rec.path("listen").asText("");
            if (pid < 1 || start == 0 || listen.isEmpty() || uid != myUid()) {
                return null;
            }
            // The user first, then the start time: the same process both times.
            Path proc = Path.of("/proc", Long.toString(pid));
            if (((Number) Files.getAttribute(proc, "unix:uid", LinkOption.NOFOLLOW_LINKS)).longValue() != uid
                    || startTime(pid) != start) {
                return null;
            }
            return holdsFlock(pid, locks.resolve("serve.lock")) ? new ServeOwner(pid, url(listen)) : null;
        } catch (IOException | RuntimeException e) {
            return null; // no record, a broken one, no /proc: nothing proven
        }
    }

    /** This process's effective user (the owner of /proc/self). */
    static long myUid() throws IOException {
        return ((Number) Files.getAttribute(Path.of("/proc/self"), "unix:uid")).longValue();
    }

    /** The start time of process pid: field 22 of /proc/PID/stat (clock ticks since boot). */
    static long startTime(long pid) throws IOException {
        String stat = Files.readString(Path.of("/proc", Long.toString(pid), "stat"), StandardCharsets.UTF_8);
        String[] f = stat.substring(stat.lastIndexOf(')') + 2).trim().split("\\s+");
        return Long.parseLong(f[19]);
    }

    /**
     * Whether process pid holds an exclusive flock on file: /proc/locks lists it as {@code FLOCK ADVISORY WRITE PID
     * MAJ:MIN:INODE …}. (Java's own file locks are POSIX locks, which neither see nor take flocks.)
     */
    static boolean holdsFlock(long pid, Path file) throws IOException {
        long ino = ((Number) Files.getAttribute(file, "unix:ino", LinkOption.NOFOLLOW_LINKS)).longValue();
        for (String line : Files.readAllLines(Path.of("/proc/locks"), StandardCharsets.UTF_8)) {
            String[] f = line.trim().split("\\s+");
            // "1:" FLOCK ADVISORY WRITE PID DEV:INODE START END; a waiter's line starts with "1: ->".
            if (f.length >= 6 && f[1].equals("FLOCK") && f[3].equals("WRITE") && f[4].equals(Long.toString(pid))) {
                String id = f[5];
                if (id.substring(id.lastIndexOf(':') + 1).equals(Long.toString(ino))) {
                    return true;
                }
            }
        }
        return false;
    }

    /** http://ADDRESS for a listen address; an unspecified host is 127.0.0.1. */
    static String url(String listen) {
        int colon = listen.lastIndexOf(':');
        String host = listen.substring(0, colon);
        if (host.isEmpty() || host.equals("0.0.0.0") || host.equals("[::]")) {
            host = "127.0.0.1";
        }
        return "http://" + host + listen.substring(colon);
    }
}
