package io.pgfork;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * Run by Surefire's "autostart" execution with no server configured (PGFORK_URL and PGFORK_TOKEN removed from the
 * environment) and PGFORK_BIN naming a pgfork build: the client starts `pgfork serve` for the run itself.
 */
class AutoStartIT {
    @Test
    void startsAServerWhenNoneIsConfigured() throws Exception {
        assertFalse(Settings.serverConfigured(), "this execution runs with no PGFORK_URL");
        Pgfork pg;
        // Whatever answers at the default address is not the run's server unless configured (docs/SECURITY.md,
        // rule 3): another user's fake there got the template request and handed back its own database.
        try (ServeTrustTest.Fake squatter = new ServeTrustTest.Fake(5000)) {
            pg = Pgfork.get();
            assertEquals(java.util.List.of(), squatter.got, "the server at the default address was sent nothing");
        }
        Path state = ServeLauncher.stateDir();
        assertTrue(Files.exists(state.resolve("serve.json")), "the started server is recorded for the run's other JVMs");
        assertEquals("rw-------", java.nio.file.attribute.PosixFilePermissions.toString(
                Files.getPosixFilePermissions(state.resolve("serve.json"))), "it holds the token: private");
        assertTrue(pg.client().baseUrl().startsWith("http://127.0.0.1:"), pg.client().maskedBaseUrl());
        // Another JVM of the run finds it by its own record, proven (pid, start time, uid, the flock it holds).
        PgforkClient found = ServeLauncher.running(state);
        assertTrue(found != null, "the started serve is found by its record in the state directory");
        assertEquals(pg.client().baseUrl(), found.baseUrl());
        TestDatabase db = pg.take(Migrators.flyway("classpath:db/migration"));
        try (Connection c = Pgfork.dataSource(db).getConnection(); Statement st = c.createStatement();
             ResultSet rs = st.executeQuery("SELECT count(*) FROM books")) {
            rs.next();
            assertEquals(1, rs.getInt(1));
        } finally {
            pg.giveBack(db, "autostart", false, false);
        }
    }

    // The PostgreSQL major and the state are the project's (issue 58). Each case runs test JVMs of its own
    // (MajorProbe) with the settings a project gives them: real pgfork serve, PostgreSQL 15 from the system and 17
    // from the test environment's installs (PGFORK_TEST_PG_BINS, see scripts/test-env.sh env).

    private final List<Path> scratch = new ArrayList<>();

    @AfterEach
    void removeScratch() throws IOException {
        for (Path d : scratch) {
            try (Stream<Path> all = Files.walk(d)) {
                all.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
            }
        }
    }

    /** A new directory the postgres OS user can reach (as root the managed PostgreSQL runs as that user). */
    private Path scratch(String what) throws IOException {
        Path d = Files.createTempDirectory(Path.of(Files.isDirectory(Path.of("/var/tmp")) ? "/var/tmp" : "/tmp"),
                "pgfork-java-" + what + "-");
        Files.setPosixFilePermissions(d, PosixFilePermissions.fromString("rwxr-xr-x"));
        scratch.add(d);
        return d;
    }

    /** A PGFORK_HOME whose installs/ holds the test environment's build of major (a link), as `pgfork pg install` leaves one. */
    private Path homeWithMajor(int major) throws IOException {
        String bins = System.getenv("PGFORK_TEST_PG_BINS");
        for (String bin : (bins == null ? "" : bins).split(":")) {
            Path inst = Path.of(bin).getParent();
            if (inst != null && inst.getParent() != null && inst.getParent().getFileName().toString().equals("installs")
                    && inst.getFileName().toString().startsWith(major + ".")) {
                Path home = scratch("home");
                Files.createDirectories(home.resolve("installs"));
                Files.createSymbolicLink(home.resolve("installs").resolve(inst.getFileName()), inst);
                return home;
            }
        }
        throw new AssertionError("no PostgreSQL " + major + " install in PGFORK_TEST_PG_BINS: run under eval \"$(scripts/test-env.sh env)\"");
    }

    /** A test JVM (MajorProbe) in dir with the environment env (over this one's, no pgfork settings) and JVM flags. */
    private static Process probe(Path dir, Map<String, String> env, List<String> jvm, String... args) throws IOException {
        List<String> cmd = new ArrayList<>(List.of(Path.of(System.getProperty("java.home"), "bin", "java").toString()));
        cmd.addAll(jvm);
        cmd.addAll(List.of("-cp", System.getProperty("java.class.path"), MajorProbe.class.getName()));
        cmd.addAll(List.of(args));
        ProcessBuilder pb = new ProcessBuilder(cmd).directory(dir.toFile()).redirectErrorStream(true);
        for (String k : List.of("PGFORK_URL", "PGFORK_TOKEN", "INTEGRESQL_CLIENT_BASE_URL", "PGFORK_STATE_DIR", "PGFORK_PG",
                "PGFORK_PG_BIN", "PGFORK_HOME", "PGFORK_SERVE_ARGS")) {
            pb.environment().remove(k);
        }
        pb.environment().putAll(env);
        return pb.start();
    }

    /** Its output up to its first VERSION or ERROR line (all of it if it has none), read as it comes. */
    private static String untilResult(Process p) throws IOException {
        StringBuilder out = new StringBuilder();
        BufferedReader r = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8));
        for (String line; (line = r.readLine()) != null; ) {
            out.append(line).append('\n');
            if (line.startsWith("VERSION ") || line.startsWith("ERROR ")) {
                break;
            }
        }
        return out.toString();
    }

    private static String run(Process p) throws Exception {
        String out = untilResult(p) + new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        p.waitFor();
        return out;
    }

    @Test
    void pgSettingGivesThatMajor() throws Exception {
        Path home = homeWithMajor(17);
        Path project = scratch("project");
        // -Dpgfork.pg=17, as Maven's Surefire or Gradle pass it; PGFORK_SERVE_ARGS reaches the started serve too
        // (split as a shell splits words): its databases are named with that prefix.
        String out = run(probe(project, Map.of("PGFORK_STATE_DIR", scratch("state").toString(), "PGFORK_HOME",
                home.toString(), "PGFORK_SERVE_ARGS", "--db-prefix 'javaargs'"), List.of("-Dpgfork.pg=17")));
        assertTrue(out.contains("VERSION 17."), "with -Dpgfork.pg=17 the started serve runs PostgreSQL 17:\n" + out);
        assertTrue(out.contains(" DB javaargs"), "with PGFORK_SERVE_ARGS=--db-prefix javaargs:\n" + out);
        // Pgfork.get("17"): what the Spring integration calls with its property pgfork.pg.
        out = run(probe(project, Map.of("PGFORK_STATE_DIR", scratch("state").toString(), "PGFORK_HOME",
                home.toString()), List.of(), "17"));
        assertTrue(out.contains("VERSION 17."), "with pgfork.pg=17 in Spring the started serve runs PostgreSQL 17:\n" + out);
    }

    @Test
    void serveOfAnotherMajorIsNotUsed() throws Exception {
        Path state = scratch("state");
        Map<String, String> env = Map.of("PGFORK_STATE_DIR", state.toString(), "PGFORK_HOME", homeWithMajor(17).toString());
        Process first = probe(scratch("project"), env, List.of("-Dpgfork.pg=15"), "-", "hold");
        try {
            String out = untilResult(first);
            assertTrue(out.contains("VERSION 15."), out);
            String second = run(probe(scratch("project"), env, List.of("-Dpgfork.pg=17")));
            assertFalse(second.contains("VERSION"), "a run asking for 17 used the serve of 15:\n" + second);
            assertTrue(second.contains("runs PostgreSQL 15.") && second.contains("asks for 17")
                    && second.contains("PGFORK_STATE_DIR"), second);
        } finally {
            first.getOutputStream().close(); // its stdin ends: it exits, and its serve with it
            first.waitFor();
        }
    }

    @Test
    void twoProjectsTwoStateDirs() throws Exception {
        Path maven = scratch("maven");
        Files.writeString(maven.resolve("pom.xml"), "<project/>");
        Path gradle = scratch("gradle");
        Files.writeString(gradle.resolve("build.gradle.kts"), "");
        for (Path project : List.of(maven, gradle)) {
            String out = run(probe(project, Map.of(), List.of()));
            assertTrue(out.contains("VERSION "), out);
        }
        assertTrue(Files.exists(maven.resolve("target/pgfork/serve.json")), "a Maven project's state is its target/pgfork");
        assertTrue(Files.isDirectory(maven.resolve("target/pgfork/state/serve")), "its managed PostgreSQL is there");
        assertTrue(Files.exists(gradle.resolve("build/pgfork/serve.json")), "a Gradle project's state is its build/pgfork");
        assertTrue(Files.isDirectory(gradle.resolve("build/pgfork/state/serve")), "its managed PostgreSQL is there");
    }
}
