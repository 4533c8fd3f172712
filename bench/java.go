package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/pool"
)

// The "java" scenario (issue 36) runs a generated Spring Boot 3.5 test suite
// (40 Flyway migrations, the js scenario's; N test methods in classes of 10,
// each writing through a JdbcTemplate: INSERT, UPDATE, SELECT) with
// `mvn -o -q test`, Surefire with 2 forks (forkCount=2, reuseForks=true),
// side by side:
//
//  1. pgfork: @AutoConfigurePgfork (clients/java's pgfork-spring, a fresh
//     database after each test method) against a pgfork serve the bench
//     starts, a cold run (builds the template) and a second run on the same
//     serve;
//  2. zonky: embedded-database-spring-test with its zonky provider (embedded
//     PostgreSQL 17 binaries) and refresh = AFTER_EACH_TEST_METHOD;
//  3. Flyway clean + migrate before each test, on one database per fork (a
//     clean in one fork must not pull the tables from under the other's);
//  4. the hand-written CREATE DATABASE … TEMPLATE per test (a
//     TestExecutionListener creates a copy of a migrated template and points
//     the DataSource at it);
//  5. the floor: the same suite on one shared database, no isolation; the
//     application's Flyway still runs at context start (validating, applying
//     nothing), as it does in pgfork's and zonky's contexts.
//
// Every contender is one Maven project of its own in the run directory, on
// Spring Boot 3.5 (zonky's 2.6.0 is for Boot 3), compiled once untimed
// (`mvn test-compile`, which also downloads what is missing into ~/.m2; the
// floor runs one test instead, its Flyway migrating its database) and
// then timed as a whole `mvn -o -q test`. Each test records the gap between
// the end of the test method before it (in the same class and fork) and its
// own start: the refresh and the framework's callbacks.
//
// PostgreSQL refuses to run as root, and zonky starts its embedded
// PostgreSQL from the test JVM: when the bench runs as root, zonky's Maven
// runs as the postgres user with a copy of ~/.m2/repository of its own.
//
// Scale: PGFORK_BENCH_JAVA_TESTS (default 200).
func init() {
	register(Scenario{Name: "java", Issue: "Java client: @AutoConfigurePgfork vs zonky, Flyway clean+migrate and CREATE DATABASE … TEMPLATE per test (issue 36)", Run: runJavaBench})
}

// The Spring Boot and zonky versions the suite is generated with.
const (
	javaBenchBoot        = "3.5.7"
	javaBenchZonky       = "2.6.0"
	javaBenchZonkyPG     = "2.1.1"  // io.zonky.test:embedded-postgres
	javaBenchZonkyBinary = "17.6.0" // io.zonky.test.postgres:embedded-postgres-binaries-*
	javaBenchClasses     = 10       // test methods per class
)

// javaBenchContender is one generated Maven project of the suite.
type javaBenchContender struct {
	dir   string // the project's directory name
	annot string // the test classes' annotations
	props string // src/test/resources/application.properties
	deps  string // extra dependencies
	bom   string // extra dependencyManagement
	extra map[string]string
	// warm is the untimed warm-up's Maven arguments (default: test-compile).
	warm []string
}

const javaBenchApp = `package bench;

import org.springframework.boot.autoconfigure.SpringBootApplication;

@SpringBootApplication
public class BenchApp {
}
`

// javaBenchBase is every test class's parent: the test's work and the gap
// recorder.
// javaBenchStatements are the statements of javaBenchBase's work(): the
// bound of a refresh runs them (javaBackendBound).
var javaBenchStatements = []string{
	"INSERT INTO t002 (name, score) VALUES ('test', 1)",
	"UPDATE t001 SET score = score + 1 WHERE id = 1",
	"SELECT count(*) FROM t002",
}

const javaBenchBase = `package bench;

import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.extension.ExtendWith;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.jdbc.core.JdbcTemplate;

@ExtendWith(Gap.class)
abstract class BenchBase {
    @Autowired
    JdbcTemplate jdbc;

    /** The test's work: it writes, as most tests of an application do. */
    void work() {
        jdbc.update("INSERT INTO t002 (name, score) VALUES ('test', 1)");
        jdbc.update("UPDATE t001 SET score = score + 1 WHERE id = 1");
        Long n = jdbc.queryForObject("SELECT count(*) FROM t002", Long.class);
        assertTrue(n != null && n >= 1);
    }
}
`

// javaBenchGap records, per test, the milliseconds from the end of the test
// method before it in the same class (same JVM) to its own start (the
// database refresh of the contender plus the framework's callbacks), and
// that gap plus the test's own run (where a contender that takes its
// database at the first connection pays for the take).
const javaBenchGap = `package bench;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import org.junit.jupiter.api.extension.AfterTestExecutionCallback;
import org.junit.jupiter.api.extension.BeforeTestExecutionCallback;
import org.junit.jupiter.api.extension.ExtensionContext;

public class Gap implements BeforeTestExecutionCallback, AfterTestExecutionCallback {
    private static long end, start;
    private static double gap = -1;
    private static Class<?> endClass;

    @Override
    public synchronized void beforeTestExecution(ExtensionContext c) {
        start = System.nanoTime();
        gap = endClass == c.getRequiredTestClass() ? (start - end) / 1e6 : -1;
    }

    @Override
    public synchronized void afterTestExecution(ExtensionContext c) throws IOException {
        double ran = (System.nanoTime() - start) / 1e6;
        String out = System.getenv("PGB_OUT");
        if (gap >= 0 && out != null) {
            String line = String.format(java.util.Locale.ROOT, "%.3f %.3f%n", gap, gap + ran);
            Files.write(Path.of(out), line.getBytes(StandardCharsets.UTF_8), StandardOpenOption.CREATE, StandardOpenOption.APPEND);
        }
        end = System.nanoTime();
        endClass = c.getRequiredTestClass();
    }
}
`

// javaBenchCleanBase: Flyway clean + migrate before each test.
const javaBenchCleanBase = `package bench;

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.SQLException;
import java.sql.Statement;
import org.flywaydb.core.Flyway;
import org.junit.jupiter.api.BeforeEach;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.test.context.DynamicPropertyRegistry;
import org.springframework.test.context.DynamicPropertySource;

abstract class CleanBase extends BenchBase {
    @Autowired
    Flyway flyway;

    /** A database for this fork (JVM) alone: clean in one fork must not hit the other's tests. */
    @DynamicPropertySource
    static void forkDatabase(DynamicPropertyRegistry r) throws SQLException {
        String db = "jb_clean_" + ProcessHandle.current().pid();
        String base = System.getenv("PGB_JDBC_BASE"), user = System.getenv("PGB_USER"), password = System.getenv("PGB_PASSWORD");
        synchronized (CleanBase.class) {
            if (!created) {
                try (Connection c = DriverManager.getConnection(base + "postgres", user, password); Statement s = c.createStatement()) {
                    s.execute("CREATE DATABASE " + db);
                }
                created = true;
            }
        }
        r.add("spring.datasource.url", () -> base + db);
    }

    private static boolean created;

    @BeforeEach
    void cleanAndMigrate() {
        flyway.clean();
        flyway.migrate();
    }
}
`

// javaBenchTemplate is the hand-written pattern: a DataSource whose target
// the listener swaps before each test for a new copy of the migrated
// template (CREATE DATABASE … TEMPLATE), dropping the copy after the test.
const javaBenchTemplate = `package bench;

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.concurrent.atomic.AtomicInteger;
import javax.sql.DataSource;
import org.springframework.boot.test.context.TestConfiguration;
import org.springframework.context.annotation.Bean;
import org.springframework.jdbc.datasource.DelegatingDataSource;
import org.springframework.jdbc.datasource.SingleConnectionDataSource;
import org.springframework.test.context.TestContext;
import org.springframework.test.context.support.AbstractTestExecutionListener;

public class TemplateCopies extends AbstractTestExecutionListener {
    static final String URL = System.getenv("PGB_JDBC_BASE"), USER = System.getenv("PGB_USER"), PASSWORD = System.getenv("PGB_PASSWORD");
    static final AtomicInteger N = new AtomicInteger();

    /** The application's DataSource: a copy of the template per test. */
    public static class Swappable extends DelegatingDataSource {
        String db;

        /** No target until the first test's copy. */
        @Override
        public void afterPropertiesSet() {
        }
    }

    @TestConfiguration
    public static class Config {
        @Bean
        DataSource dataSource() {
            return new Swappable();
        }
    }

    static void admin(String sql) throws SQLException {
        try (Connection c = DriverManager.getConnection(URL + "postgres", USER, PASSWORD); Statement s = c.createStatement()) {
            s.execute(sql);
        }
    }

    @Override
    public void beforeTestMethod(TestContext tc) throws SQLException {
        Swappable ds = tc.getApplicationContext().getBean(Swappable.class);
        String db = "jbt_" + ProcessHandle.current().pid() + "_" + N.incrementAndGet();
        admin("CREATE DATABASE " + db + " TEMPLATE jb_template");
        ds.db = db;
        ds.setTargetDataSource(new SingleConnectionDataSource(URL + db, USER, PASSWORD, true));
    }

    @Override
    public void afterTestMethod(TestContext tc) throws SQLException {
        Swappable ds = tc.getApplicationContext().getBean(Swappable.class);
        ((SingleConnectionDataSource) ds.getTargetDataSource()).destroy();
        admin("DROP DATABASE " + ds.db);
    }
}
`

func javaBenchContenders() []javaBenchContender {
	common := "spring.datasource.username=${PGB_USER}\nspring.datasource.password=${PGB_PASSWORD}\n"
	return []javaBenchContender{
		{dir: "pgfork", annot: "@SpringBootTest\n@io.pgfork.spring.AutoConfigurePgfork",
			deps: `<dependency><groupId>io.pgfork</groupId><artifactId>pgfork-spring</artifactId><version>${pgfork.version}</version><scope>test</scope></dependency>`},
		{dir: "zonky", annot: "@SpringBootTest\n@io.zonky.test.db.AutoConfigureEmbeddedDatabase(provider = io.zonky.test.db.AutoConfigureEmbeddedDatabase.DatabaseProvider.ZONKY, " +
			"refresh = io.zonky.test.db.AutoConfigureEmbeddedDatabase.RefreshMode.AFTER_EACH_TEST_METHOD)",
			deps: `<dependency><groupId>io.zonky.test</groupId><artifactId>embedded-database-spring-test</artifactId><version>` + javaBenchZonky + `</version><scope>test</scope></dependency>
    <dependency><groupId>io.zonky.test</groupId><artifactId>embedded-postgres</artifactId><version>` + javaBenchZonkyPG + `</version><scope>test</scope></dependency>`,
			bom: `<dependency><groupId>io.zonky.test.postgres</groupId><artifactId>embedded-postgres-binaries-bom</artifactId><version>` + javaBenchZonkyBinary + `</version><type>pom</type><scope>import</scope></dependency>`,
			// One test: zonky's Maven has a repository of its own, copied before
			// any warm-up ran a test, and test-compile does not fetch what
			// Surefire resolves when it runs (its JUnit Platform launcher).
			warm: javaBenchOneTest},
		{dir: "clean", annot: "@SpringBootTest", props: "spring.flyway.clean-disabled=false\n" + common,
			extra: map[string]string{"src/test/java/bench/CleanBase.java": javaBenchCleanBase}},
		{dir: "template", annot: "@SpringBootTest\n@org.springframework.context.annotation.Import(TemplateCopies.Config.class)\n" +
			"@org.springframework.test.context.TestExecutionListeners(listeners = TemplateCopies.class, mergeMode = org.springframework.test.context.TestExecutionListeners.MergeMode.MERGE_WITH_DEFAULTS)",
			props: "spring.flyway.enabled=false\n",
			extra: map[string]string{"src/test/java/bench/TemplateCopies.java": javaBenchTemplate}},
		// The floor is the application as it is, Flyway included: at context start
		// Flyway validates the migrated database and applies nothing (its warm-up
		// run of one test migrated it), as pgfork's and zonky's contexts run it.
		{dir: "floor", annot: "@SpringBootTest", props: "spring.datasource.url=${PGB_JDBC_BASE}jb_floor\n" + common,
			warm: javaBenchOneTest},
	}
}

// javaBenchOneTest is a warm-up that runs the suite's first test.
var javaBenchOneTest = []string{"-q", "test", "-Dtest=T000Test#t000", "-Dsurefire.failIfNoSpecifiedTests=false"}

func javaBenchPom(c javaBenchContender) string {
	return fmt.Sprintf(`<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
         xsi:schemaLocation="http://maven.apache.org/POM/4.0.0 https://maven.apache.org/xsd/maven-4.0.0.xsd">
  <modelVersion>4.0.0</modelVersion>
  <parent>
    <groupId>org.springframework.boot</groupId>
    <artifactId>spring-boot-starter-parent</artifactId>
    <version>%s</version>
    <relativePath/>
  </parent>
  <groupId>io.pgfork.bench</groupId>
  <artifactId>bench-%s</artifactId>
  <version>0.0.1</version>
  <properties>
    <java.version>17</java.version>
    <pgfork.version>0.1.0-SNAPSHOT</pgfork.version>
  </properties>
  <dependencyManagement><dependencies>%s</dependencies></dependencyManagement>
  <dependencies>
    <dependency><groupId>org.springframework.boot</groupId><artifactId>spring-boot-starter-jdbc</artifactId></dependency>
    <dependency><groupId>org.flywaydb</groupId><artifactId>flyway-core</artifactId></dependency>
    <dependency><groupId>org.flywaydb</groupId><artifactId>flyway-database-postgresql</artifactId></dependency>
    <dependency><groupId>org.postgresql</groupId><artifactId>postgresql</artifactId><scope>runtime</scope></dependency>
    <dependency><groupId>org.springframework.boot</groupId><artifactId>spring-boot-starter-test</artifactId><scope>test</scope></dependency>
    %s
  </dependencies>
  <build><plugins>
    <plugin><groupId>org.apache.maven.plugins</groupId><artifactId>maven-surefire-plugin</artifactId>
      <configuration>
        <forkCount>2</forkCount>
        <reuseForks>true</reuseForks>
      </configuration>
    </plugin>
  </plugins></build>
</project>
`, javaBenchBoot, c.dir, c.bom, c.deps)
}

// javaBenchProject writes contender c's Maven project under dir with tests
// test methods.
func javaBenchProject(dir string, c javaBenchContender, tests int) error {
	files := map[string]string{
		"pom.xml":                                   javaBenchPom(c),
		"src/main/java/bench/BenchApp.java":         javaBenchApp,
		"src/test/java/bench/BenchBase.java":        javaBenchBase,
		"src/test/java/bench/Gap.java":              javaBenchGap,
		"src/test/resources/application.properties": "spring.main.banner-mode=off\nlogging.level.root=WARN\n" + c.props,
	}
	for name, sql := range jsMigrations() {
		n, err := strconv.Atoi(strings.TrimSuffix(name, "_m.sql"))
		if err != nil {
			return fmt.Errorf("migration %s: %w", name, err)
		}
		files[fmt.Sprintf("src/main/resources/db/migration/V%d__m%03d.sql", n, n)] = sql
	}
	for name, content := range c.extra {
		files[name] = content
	}
	base := "BenchBase"
	if c.dir == "clean" {
		base = "CleanBase"
	}
	for k := 0; k*javaBenchClasses < tests; k++ {
		var b strings.Builder
		fmt.Fprintf(&b, "package bench;\n\nimport org.junit.jupiter.api.Test;\nimport org.springframework.boot.test.context.SpringBootTest;\n\n%s\nclass T%03dTest extends %s {\n", c.annot, k, base)
		for m := k * javaBenchClasses; m < min(tests, (k+1)*javaBenchClasses); m++ {
			fmt.Fprintf(&b, "    @Test\n    void t%03d() {\n        work();\n    }\n\n", m)
		}
		b.WriteString("}\n")
		files[fmt.Sprintf("src/test/java/bench/T%03dTest.java", k)] = b.String()
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// javaMaven runs mvn in proj with env; as is a user to run it as (nil: as
// ourselves) with home its HOME.
type javaMaven struct {
	ctx  context.Context
	as   *syscall.Credential
	home string
	repo string // -Dmaven.repo.local, or "" for the user's
}

func (m javaMaven) cmd(proj string, env []string, args ...string) *exec.Cmd {
	all := []string{"-B", "-ntp"}
	if m.repo != "" {
		all = append(all, "-Dmaven.repo.local="+m.repo)
	}
	cmd := exec.CommandContext(m.ctx, "mvn", append(all, args...)...)
	cmd.Dir = proj
	cmd.Env = append(os.Environ(), env...)
	if m.as != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: m.as}
		cmd.Env = append(cmd.Env, "HOME="+m.home, "USER=postgres", "LOGNAME=postgres")
	}
	return cmd
}

// run runs a timed `mvn -o -q test` of tests tests and returns its wall
// time and, per test, the gap before it and that gap plus its own run.
func (m javaMaven) run(proj string, env []string, tests int) (time.Duration, Sample, Sample, error) {
	out := filepath.Join(proj, fmt.Sprintf("gaps-%d.txt", time.Now().UnixNano()))
	cmd := m.cmd(proj, append(env, "PGB_OUT="+out), "-o", "-q", "test")
	took, _, err := runSuite(cmd, "")
	if err != nil {
		return took, nil, nil, fmt.Errorf("%w\nroot causes (target/surefire-reports): %s", err, javaCauses(filepath.Join(proj, "target", "surefire-reports")))
	}
	gaps, spans := readTimings(out)
	if want := tests - (tests+javaBenchClasses-1)/javaBenchClasses; len(gaps) != want {
		return took, gaps, spans, fmt.Errorf("%s: %d test gaps recorded, want %d (did every test run?)", proj, len(gaps), want)
	}
	return took, gaps, spans, nil
}

func runJavaBench(ctx context.Context, r *Report) error {
	r.Notef("Load average at start: %s (2 cores shared with other work; times grow with contention).", loadAvg())
	defer func() { r.Notef("Load average at the end: %s.", loadAvg()) }()
	tests := 200
	if v, err := strconv.Atoi(os.Getenv("PGFORK_BENCH_JAVA_TESTS")); err == nil && v > 0 {
		tests = v
	}
	if tests != 200 {
		r.Notef("SCALED: %d tests (issue: 200).", tests)
	}
	for _, tool := range []string{"mvn", "java"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found: the java scenario needs a JDK 17+ and Maven (Debian: apt-get install maven)", tool)
		}
	}
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	tmp, bin, err := clientWorkspace("pgfork-bench-java-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	self := javaMaven{ctx: ctx}
	// The client as the README has users depend on it: io.pgfork:pgfork-spring
	// from the Maven repository, installed from this tree.
	t0 := time.Now()
	install := self.cmd(filepath.Join(wd, "clients", "java"), nil, "-q", "install", "-DskipTests", "-pl", "pgfork-spring", "-am")
	if out, err := install.CombinedOutput(); err != nil {
		return fmt.Errorf("installing clients/java (mvn install -pl pgfork-spring -am): %v:\n%s", err, out[max(0, len(out)-3000):])
	}
	installTook := time.Since(t0)

	// zonky's Maven as the postgres user when we are root (PostgreSQL refuses
	// root), with a copy of the user's repository it can read.
	zonky := self
	if user, err := instance.ResolveUser(""); err != nil {
		return err
	} else if user != nil {
		home := filepath.Join(tmp, "zonky-home")
		repo := filepath.Join(home, "m2")
		if err := os.MkdirAll(home, 0o755); err != nil {
			return err
		}
		m2 := filepath.Join(os.Getenv("HOME"), ".m2", "repository")
		if out, err := exec.CommandContext(ctx, "cp", "-a", m2, repo).CombinedOutput(); err != nil {
			return fmt.Errorf("copying %s for zonky's Maven: %v: %s", m2, err, out)
		}
		zonky = javaMaven{ctx: ctx, as: &syscall.Credential{Uid: uint32(user.UID), Gid: uint32(user.GID)}, home: home, repo: repo}
	}

	_, pg, stopPG, err := benchPG18(ctx, os.TempDir())
	if err != nil {
		return err
	}
	defer stopPG()
	admin, err := pgx.Connect(ctx, pg.url)
	if err != nil {
		return err
	}
	version := pg.version
	for _, db := range []string{"jb_template", "jb_floor"} {
		if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
			admin.Close(ctx)
			return err
		}
	}
	admin.Close(ctx)
	// The template of (4), migrated untimed (it runs with Flyway off); the
	// floor's database is migrated by its own Flyway in its warm-up.
	if err := rustBenchMigrate(ctx, pg, "jb_template"); err != nil {
		return err
	}

	stateDir := filepath.Join(tmp, "state")
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return err
	}
	port := 17000 + os.Getpid()%1000*3 + 2
	// serve's own pool sizes (issue 33): a pinned --pool-init turns off
	// the learning of the demand, and a pinned --pool-max held 16 of a
	// 200-test run.
	srv, err := startServeEnv(bin, stateDir, port, []string{"PGFORK_PG_URL=" + pg.url})
	if err != nil {
		return err
	}
	defer func() { _ = srv.stop() }()
	env := []string{
		fmt.Sprintf("PGB_JDBC_BASE=jdbc:postgresql://%s:%d/", pg.host, pg.port), "PGB_USER=" + pg.user, "PGB_PASSWORD=" + pg.password,
		"PGFORK_URL=" + srv.base, "PGFORK_TOKEN=", "PGFORK_BIN=" + bin,
	}

	// Generate and compile every contender (untimed).
	projects := map[string]string{}
	mavens := map[string]javaMaven{}
	var compiles []string
	for _, c := range javaBenchContenders() {
		proj := filepath.Join(tmp, "suite-"+c.dir)
		if err := javaBenchProject(proj, c, tests); err != nil {
			return err
		}
		m := self
		if c.dir == "zonky" {
			m = zonky
			if m.as != nil {
				if out, err := exec.Command("chown", "-R", fmt.Sprintf("%d:%d", m.as.Uid, m.as.Gid), proj, m.home).CombinedOutput(); err != nil {
					return fmt.Errorf("chown for zonky's Maven: %v: %s", err, out)
				}
			}
		}
		t := time.Now()
		warm := c.warm
		if warm == nil {
			warm = []string{"-q", "test-compile"}
		}
		if out, err := m.cmd(proj, env, warm...).CombinedOutput(); err != nil {
			return fmt.Errorf("mvn %s in %s: %v:\n%s", strings.Join(warm, " "), proj, err, out[max(0, len(out)-3000):])
		}
		compiles = append(compiles, fmt.Sprintf("%s %s", c.dir, Dur(time.Since(t))))
		projects[c.dir], mavens[c.dir] = proj, m
	}
	mvnV, _ := exec.Command("mvn", "-B", "-v").Output()
	javaV, _ := exec.Command("java", "-version").CombinedOutput()
	r.Notef("Suite: 40 generated Flyway migrations (60 tables with two indexes each and foreign keys, 5 functions; the js scenario's), %d test methods in classes of %d, "+
		"each writing through a JdbcTemplate (INSERT, UPDATE, SELECT count), Spring Boot %s, one @SpringBootTest context per fork (Spring's context cache), "+
		"Surefire forkCount=2 reuseForks=true; %s; %s. Each contender is a Maven project of its own; installing clients/java's pgfork-spring (%s) and the warm-up "+
		"`mvn test-compile` of each (the floor: one test, its Flyway migrating its database; zonky: one test) (%s) are not counted. PostgreSQL %s (test profile, fsync off) on ext4 for every contender but zonky (its embedded PostgreSQL %s binaries, "+
		"initdb'd by zonky in the test JVM).",
		tests, javaBenchClasses, javaBenchBoot, firstLine(string(mvnV)), firstLine(string(javaV)), Dur(installTook), strings.Join(compiles, ", "), version, javaBenchZonkyBinary)
	if zonky.as != nil {
		r.Notef("zonky's Maven ran as the postgres user (PostgreSQL refuses root) with a copy of ~/.m2/repository; the others as root with ~/.m2.")
	}

	type javaRun struct {
		name  string
		took  time.Duration
		gaps  Sample
		spans Sample  // gap + test
		busy  float64 // share of the cores busy during the run (-1: not measured)
	}
	var res []javaRun
	byName := map[string]javaRun{}
	add := func(x javaRun) {
		res = append(res, x)
		byName[x.name] = x
	}
	measure := func(name, dir string, extraEnv ...string) (javaRun, error) {
		c0 := readCPU()
		took, gaps, spans, err := mavens[dir].run(projects[dir], append(slices.Clip(env), extraEnv...), tests)
		if err != nil {
			return javaRun{}, err
		}
		fmt.Printf("  %s: %s\n", name, Dur(took))
		return javaRun{name, took, gaps, spans, readCPU().busySince(c0)}, nil
	}
	run := func(name, dir string, extraEnv ...string) error {
		x, err := measure(name, dir, extraEnv...)
		if err == nil {
			add(x)
		}
		return err
	}
	const (
		pCold   = "(1) @AutoConfigurePgfork, cold: builds the template"
		pSecond = "(1) @AutoConfigurePgfork, second run on the same serve"
		zonkyR  = "(2) zonky, refresh AFTER_EACH_TEST_METHOD"
		cleanR  = "(3) Flyway clean + migrate per test"
		tmplR   = "(4) CREATE DATABASE … TEMPLATE per test"
		floorR  = "(5) floor: one shared database, no isolation"
	)
	// Every run after the first waits for pgfork serve to settle: its pool
	// fills to the demand the cold run showed, and that filling (full copies
	// on ext4) must not run beside another contender's suite.
	// After a pgfork run that wait begins once the pool has seen the run
	// end (no hand-out for its run gap): then it learns the run's demand and
	// starts the recreations it deferred, and settle sees them.
	afterPgfork := false
	settled := func(before string) error {
		if afterPgfork {
			time.Sleep(pool.DefaultRunGap + time.Second)
			afterPgfork = false
		}
		if err := srv.settle(ctx, 5*time.Minute); err != nil {
			return fmt.Errorf("before %s: %w", before, err)
		}
		return nil
	}
	afterPgfork = true
	if err := run(pCold, "pgfork"); err != nil {
		return err
	}
	for _, x := range []struct{ name, dir string }{{zonkyR, "zonky"}, {cleanR, "clean"}, {tmplR, "template"}} {
		if err := settled(x.name); err != nil {
			return err
		}
		if err := run(x.name, x.dir); err != nil {
			return err
		}
	}
	if err := settled(pSecond); err != nil {
		return err
	}
	poolBefore := srv.poolNote()
	// The second run and the floor alternate (alternateRuns): the floor
	// drifts with the machine's load, and each is the run of median suite
	// time of its laterRuns.
	seconds, floors, err := alternateRuns(func() error { return settled("the next run") },
		func() (javaRun, error) {
			afterPgfork = true
			return measure(pSecond, "pgfork")
		},
		func() (javaRun, error) { return measure(floorR, "floor") })
	if err != nil {
		return fmt.Errorf("second runs and floors: %w", err)
	}
	took := func(x javaRun) time.Duration { return x.took }
	add(medianBy(seconds, took))
	add(medianBy(floors, took))

	floor := byName[floorR]
	var rows [][]string
	for _, x := range res {
		rows = append(rows, []string{x.name, Dur(x.took), Times(x.took, floor.took), Dur(x.took - floor.took), x.gaps.Cell(0.5), x.gaps.Cell(0.99), x.spans.Cell(0.5), Dur(x.spans.Quantile(0.5) - floor.spans.Quantile(0.5)), busyCell(x.busy)})
	}
	r.Notef("Whole `mvn -o -q test` runs (%d tests, Maven's start and Surefire's forks included), one run each in this order, but pgfork's second run and the floor, "+
		"which ran %d times each in turns after the others (second, floor, second, floor …) and are each the run of median suite time; "+
		"pgfork serve with its own pool sizes (what it said: %s); each run after the cold one once pgfork's pool had settled (its filling never beside another suite; before the second run: %s). Gap: per test, from the end of the test method before it "+
		"(same class, same fork) to its own start: the contender's refresh and the framework's callbacks (the floor's gap is those callbacks alone); "+
		"gap + test adds the test's own run, where a contender that takes its database at the first connection pays for it, and its p50 over the floor's is the per-test refresh. "+
		"(4) runs CREATE DATABASE … TEMPLATE at the default strategy (WAL_LOG) from a template the bench migrated (Flyway off); the floor's database was migrated "+
		"by its Flyway in its warm-up, and its runs' Flyway validates it and applies nothing, as in pgfork's contexts (whose copies come migrated).", tests, laterRuns, srv.sized(), poolBefore)
	r.Table([]string{"contender", "suite", "vs floor", "over the floor", "gap p50", "gap p99", "gap + test p50", "refresh: over the floor's", "cores busy"}, rows)
	// The bound of a refresh: each test's copy is a new database, and a
	// PostgreSQL backend serves one database, so every test pays at least
	// a new connection's backend (its start, authentication, cold caches).
	bound, err := javaBackendBound(ctx, pg, mavens["floor"], projects["floor"])
	if err != nil {
		return fmt.Errorf("the bound of a refresh: %w", err)
	}
	r.Notef("Cores busy: the share of the machine's %d cores busy during the whole run (/proc/stat), Maven's start included. "+
		"Bound of a refresh, measured after the runs on the same cluster: the tests' three statements on a new connection (pgx: connect as the tests do, over TCP with SCRAM, "+
		"the statements, close) take %s p50 (p99 %s), on an open connection %s (p99 %s), %d times each in turns: %s per test; with pgjdbc (the suite's driver, "+
		"from the floor project's classpath, in a JVM of its own after %d unrecorded rounds) %s against %s: %s per test. That is what no fresh database per test avoids, "+
		"since a copy is a new database and a PostgreSQL backend serves one database; where the suite keeps the cores busy, that work adds to its tests' time "+
		"(the ready-ahead copy's connection moves it out of the gap, not off the cores).",
		runtime.NumCPU(), bound.fresh.Cell(0.5), bound.fresh.Cell(0.99), bound.open.Cell(0.5), bound.open.Cell(0.99), len(bound.fresh), Dur(bound.cost()),
		len(bound.jdbcFresh)/4, bound.jdbcFresh.Cell(0.5), bound.jdbcOpen.Cell(0.5), Dur(bound.jdbcCost()))
	second, cold := byName[pSecond], byName[pCold]
	for _, t := range []struct {
		base  javaRun
		times float64
	}{{byName[zonkyR], 3}, {byName[cleanR], 10}} {
		met := second.took > 0 && float64(t.base.took) >= t.times*float64(second.took)
		r.Target(met, "@AutoConfigurePgfork's second run ≥ %.0fx %s: %s vs %s = %s (cold, template build included: %s; "+
			"at most %s is possible, the floor's: no contender runs faster than the same suite without isolation); "+
			"their time over the floor's %s (Maven, the forks' JVMs, Spring's context, the tests' own work): %s vs %s = %s",
			t.times, t.base.name, Dur(second.took), Dur(t.base.took), Ratio(t.base.took, second.took), Ratio(t.base.took, cold.took), Ratio(t.base.took, floor.took),
			Dur(floor.took), Dur(second.took-floor.took), Dur(t.base.took-floor.took), Ratio(t.base.took-floor.took, second.took-floor.took))
	}
	r.FloorTarget("@AutoConfigurePgfork's second run", second.took, floor.took, 1.5)
	if len(second.spans) > 0 && len(floor.spans) > 0 {
		refresh := second.spans.Quantile(0.5) - floor.spans.Quantile(0.5)
		r.Target(refresh <= 5*time.Millisecond, "per-test refresh of @AutoConfigurePgfork from a warm pool (second run: the gap before a test plus the test, "+
			"p50, less the floor's, which has no refresh): %s (≤ 5 ms): gap + test p50 %s (p99 %s) against the floor's %s, over %d tests; the gap alone: p50 %s against the floor's %s; "+
			"the bound of a new backend, measured above: %s with pgjdbc (%s with pgx); cores busy during the second run %s, the floor's %s",
			Dur(refresh), second.spans.Cell(0.5), second.spans.Cell(0.99), floor.spans.Cell(0.5), len(second.spans), second.gaps.Cell(0.5), floor.gaps.Cell(0.5),
			Dur(bound.jdbcCost()), Dur(bound.cost()), busyCell(second.busy), busyCell(floor.busy))
	} else {
		r.Notef("**NOT MEASURED**: per-test refresh p50 ≤ 5 ms: no gaps recorded.")
	}
	return nil
}

// javaBackend is the bound of a refresh (newBackendCost) for the java
// suite's tests: with pgx (fresh, open) and with pgjdbc, the suite's own
// driver (jdbcFresh, jdbcOpen).
type javaBackend struct{ fresh, open, jdbcFresh, jdbcOpen Sample }

// cost is the p50 a new backend adds to a test's statements (pgx).
func (b javaBackend) cost() time.Duration { return b.fresh.Quantile(0.5) - b.open.Quantile(0.5) }

// jdbcCost is the same with pgjdbc, in the JVM.
func (b javaBackend) jdbcCost() time.Duration {
	return b.jdbcFresh.Quantile(0.5) - b.jdbcOpen.Quantile(0.5)
}

// javaBenchBound is the pgjdbc side of javaBackendBound, run as a
// single-file source program: rounds of a new connection with the
// statements, then the statements on an open connection (the first quarter
// unrecorded, for the JIT); it prints each kind's nanoseconds on a line.
const javaBenchBound = `import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.Statement;
import java.util.Arrays;
import java.util.Properties;
import java.util.stream.Collectors;

public class Bound {
    public static void main(String[] a) throws Exception {
        Properties p = new Properties();
        p.setProperty("user", a[1]);
        p.setProperty("password", a[2]);
        int n = Integer.parseInt(a[3]);
        String[] stmts = Arrays.copyOfRange(a, 4, a.length);
        long[] fresh = new long[n], open = new long[n];
        try (Connection o = DriverManager.getConnection(a[0], p)) {
            for (int i = -n / 4; i < n; i++) {
                long t0 = System.nanoTime();
                try (Connection c = DriverManager.getConnection(a[0], p)) {
                    run(c, stmts);
                }
                long t1 = System.nanoTime();
                run(o, stmts);
                long t2 = System.nanoTime();
                if (i >= 0) {
                    fresh[i] = t1 - t0;
                    open[i] = t2 - t1;
                }
            }
        }
        System.out.println("fresh " + Arrays.stream(fresh).mapToObj(Long::toString).collect(Collectors.joining(" ")));
        System.out.println("open " + Arrays.stream(open).mapToObj(Long::toString).collect(Collectors.joining(" ")));
    }

    static void run(Connection c, String[] stmts) throws Exception {
        try (Statement st = c.createStatement()) {
            for (String s : stmts) {
                st.execute(s);
            }
        }
    }
}
`

// javaBackendBound measures it on a copy of the migrated template (the
// floor's database keeps its rows), as the tests' role, with their
// statements: with pgx, then with pgjdbc from the floor project's test
// classpath (proj, Maven m), as the suite's tests connect (TCP, SCRAM).
func javaBackendBound(ctx context.Context, pg pgServer, m javaMaven, proj string) (javaBackend, error) {
	admin, err := pgx.Connect(ctx, pg.url)
	if err != nil {
		return javaBackend{}, err
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE jb_bound TEMPLATE jb_template"); err != nil {
		return javaBackend{}, err
	}
	defer func() { _, _ = admin.Exec(ctx, "DROP DATABASE jb_bound") }()
	const n = 200
	var b javaBackend
	if b.fresh, b.open, err = newBackendCost(ctx, pg.db("jb_bound").url(), javaBenchStatements, n); err != nil {
		return b, err
	}
	cpFile := filepath.Join(proj, "bound-classpath.txt")
	if out, err := m.cmd(proj, nil, "-q", "dependency:build-classpath", "-Dmdep.includeScope=test", "-Dmdep.outputFile="+cpFile).CombinedOutput(); err != nil {
		return b, fmt.Errorf("the floor project's classpath (mvn dependency:build-classpath): %v: %s", err, out)
	}
	cp, err := os.ReadFile(cpFile)
	if err != nil {
		return b, err
	}
	src := filepath.Join(proj, "Bound.java")
	if err := os.WriteFile(src, []byte(javaBenchBound), 0o644); err != nil {
		return b, err
	}
	url := fmt.Sprintf("jdbc:postgresql://%s:%d/jb_bound?sslmode=disable", pg.host, pg.port)
	args := append([]string{"-cp", strings.TrimSpace(string(cp)), src, url, pg.user, pg.password, strconv.Itoa(n)}, javaBenchStatements...)
	out, err := exec.CommandContext(ctx, "java", args...).Output()
	if err != nil {
		return b, fmt.Errorf("java Bound.java (pgjdbc): %w", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		var s Sample
		for _, v := range f[1:] {
			ns, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return b, fmt.Errorf("java Bound.java printed %q", line)
			}
			s = append(s, time.Duration(ns))
		}
		switch f[0] {
		case "fresh":
			b.jdbcFresh = s
		case "open":
			b.jdbcOpen = s
		}
	}
	if len(b.jdbcFresh) != n || len(b.jdbcOpen) != n {
		return b, fmt.Errorf("java Bound.java printed %d and %d samples, want %d each: %s", len(b.jdbcFresh), len(b.jdbcOpen), n, out)
	}
	return b, nil
}

// firstLine is s's first line.
func firstLine(s string) string {
	l, _, _ := strings.Cut(strings.TrimSpace(ansiEscape.ReplaceAllString(s, "")), "\n")
	return l
}

// ansiEscape matches a terminal's colour codes (Maven prints them even with -B).
var ansiEscape = regexp.MustCompile("\x1b\\[[0-9;]*m")

// javaCauses is the distinct "Caused by:" lines of Surefire's reports in
// dir (the root of a context failure, which Maven's summary leaves out).
func javaCauses(dir string) string {
	files, _ := filepath.Glob(filepath.Join(dir, "*.txt"))
	seen := map[string]bool{}
	var out []string
	for _, f := range files {
		b, _ := os.ReadFile(f)
		for _, l := range strings.Split(string(b), "\n") {
			if l = strings.TrimSpace(l); strings.HasPrefix(l, "Caused by:") && !seen[l] && len(out) < 8 {
				seen[l] = true
				out = append(out, l)
			}
		}
	}
	if len(out) == 0 {
		return "none found"
	}
	return "\n" + strings.Join(out, "\n")
}
