package io.pgfork.junit;

import io.pgfork.DatabaseConfig;
import io.pgfork.GiveBacks;
import io.pgfork.Migrator;
import io.pgfork.Migrators;
import io.pgfork.Pgfork;
import io.pgfork.TestDatabase;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.SQLException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import javax.sql.DataSource;
import org.junit.jupiter.api.extension.AfterAllCallback;
import org.junit.jupiter.api.extension.AfterEachCallback;
import org.junit.jupiter.api.extension.BeforeAllCallback;
import org.junit.jupiter.api.extension.BeforeEachCallback;
import org.junit.jupiter.api.extension.ExtensionContext;
import org.junit.jupiter.api.extension.ParameterContext;
import org.junit.jupiter.api.extension.ParameterResolutionException;
import org.junit.jupiter.api.extension.ParameterResolver;
import org.junit.platform.commons.support.AnnotationSupport;

/**
 * The JUnit 5 extension behind {@link PgforkTest}; register it yourself to configure it in code:
 *
 * <pre>{@code
 * @RegisterExtension
 * static PgforkExtension db = PgforkExtension.flyway("classpath:db/migration");
 * }</pre>
 *
 * Parameters of type {@link DataSource}, {@link Connection} (opened for the test, closed after it),
 * {@link DatabaseConfig} and {@link TestDatabase} are resolved to the current test's database. A used database is
 * given back on a background thread ({@link GiveBacks}), so the next test does not wait for the server; the end of
 * the test run waits for every give-back, and an error of one fails the next test (or, after the last, the run).
 */
public final class PgforkExtension implements BeforeAllCallback, AfterAllCallback, BeforeEachCallback,
        AfterEachCallback, ParameterResolver {
    private static final ExtensionContext.Namespace NS = ExtensionContext.Namespace.create(PgforkExtension.class);
    /** How long the end of a test run waits for databases still being given back. */
    private static final Duration DRAIN_WAIT = Duration.ofSeconds(60);

    private final Migrator migrator; // null: from the @PgforkTest annotation
    private final PgforkTest.Scope scope;
    private final boolean readOnly;

    /** The extension as {@link PgforkTest} registers it: configured by the annotation. */
    public PgforkExtension() {
        this(null, null, false);
    }

    private PgforkExtension(Migrator migrator, PgforkTest.Scope scope, boolean readOnly) {
        this.migrator = migrator;
        this.scope = scope;
        this.readOnly = readOnly;
    }

    /**
     * Templates migrated by Flyway.
     *
     * @param locations Flyway locations (default {@code classpath:db/migration})
     * @return the extension
     */
    public static PgforkExtension flyway(String... locations) {
        return new PgforkExtension(Migrators.flyway(locations), PgforkTest.Scope.METHOD, false);
    }

    /**
     * Templates migrated by a Liquibase changelog.
     *
     * @param changelog its classpath path
     * @return the extension
     */
    public static PgforkExtension liquibase(String changelog) {
        return new PgforkExtension(Migrators.liquibase(changelog), PgforkTest.Scope.METHOD, false);
    }

    /**
     * Templates made by any {@link Migrator} (for example {@link Migrators#sqlFiles}).
     *
     * @param m the migrator
     * @return the extension
     */
    public static PgforkExtension of(Migrator m) {
        return new PgforkExtension(m, PgforkTest.Scope.METHOD, false);
    }

    /** @return this extension with one database for the whole class */
    public PgforkExtension perClass() {
        return new PgforkExtension(migrator, PgforkTest.Scope.CLASS, readOnly);
    }

    /** @return this extension with databases given back unchanged (for tests that only read) */
    public PgforkExtension readOnly() {
        return new PgforkExtension(migrator, scope, true);
    }

    private record Config(Migrator migrator, PgforkTest.Scope scope, boolean readOnly) {
    }

    private Config config(ExtensionContext ctx) {
        if (migrator != null) {
            return new Config(migrator, scope, readOnly);
        }
        Optional<PgforkTest> a = ctx.getTestClass().flatMap(c -> AnnotationSupport.findAnnotation(c, PgforkTest.class));
        if (a.isEmpty()) {
            return new Config(Migrators.flyway(), PgforkTest.Scope.METHOD, false);
        }
        PgforkTest t = a.get();
        int given = (t.flyway().length > 0 ? 1 : 0) + (t.liquibase().isEmpty() ? 0 : 1) + (t.sql().isEmpty() ? 0 : 1);
        if (given > 1) {
            throw new IllegalArgumentException("@PgforkTest on " + ctx.getRequiredTestClass().getName()
                    + ": give one of flyway, liquibase and sql");
        }
        Migrator m = !t.liquibase().isEmpty() ? Migrators.liquibase(t.liquibase())
                : !t.sql().isEmpty() ? Migrators.sqlFiles(Path.of(t.sql()))
                : Migrators.flyway(t.flyway());
        return new Config(m, t.scope(), t.readOnly());
    }

    /** What one scope holds: its database, whether a test in it failed, the connections handed out. */
    private static final class Holder {
        final TestDatabase db;
        boolean failed;
        final List<Connection> connections = new ArrayList<>();

        Holder(TestDatabase db) {
            this.db = db;
        }
    }

    @Override
    public void beforeAll(ExtensionContext ctx) {
        Config c = config(ctx);
        if (c.scope() == PgforkTest.Scope.CLASS) {
            ctx.getStore(NS).put(Holder.class, new Holder(Pgfork.get().take(c.migrator())));
        }
    }

    @Override
    public void beforeEach(ExtensionContext ctx) {
        Config c = config(ctx);
        if (c.scope() == PgforkTest.Scope.METHOD) {
            ctx.getStore(NS).put(Holder.class, new Holder(Pgfork.get().take(c.migrator())));
        }
    }

    @Override
    public void afterEach(ExtensionContext ctx) throws SQLException {
        Holder h = ctx.getStore(NS).get(Holder.class, Holder.class); // the method's, else the class's
        if (h == null) {
            return;
        }
        boolean failed = ctx.getExecutionException().isPresent();
        closeConnections(h);
        if (ctx.getStore(NS).remove(Holder.class, Holder.class) != null) { // the method's own
            give(ctx, h, ctx.getDisplayName() + " (" + ctx.getRequiredTestClass().getSimpleName() + ")", failed, config(ctx));
        } else if (failed) {
            h.failed = true;
        }
    }

    @Override
    public void afterAll(ExtensionContext ctx) throws SQLException {
        Holder h = ctx.getStore(NS).remove(Holder.class, Holder.class);
        if (h != null) {
            closeConnections(h);
            give(ctx, h, ctx.getRequiredTestClass().getSimpleName(), h.failed || ctx.getExecutionException().isPresent(), config(ctx));
        }
    }

    /**
     * Gives h's database back on a background thread (a failed test's is kept and printed now), then throws the
     * error of an earlier background give-back, if one failed: the test after it reports it.
     */
    private static void give(ExtensionContext ctx, Holder h, String name, boolean failed, Config c) {
        GiveBacks g = giveBacks(ctx);
        g.giveBack(h.db, name, failed, c.readOnly(), null);
        g.throwError();
    }

    /** The run's give-backs: one per test run (the root context), waited for when the run ends. */
    private static GiveBacks giveBacks(ExtensionContext ctx) {
        return ctx.getRoot().getStore(NS).getOrComputeIfAbsent(Drain.class, k -> new Drain(new GiveBacks(Pgfork.get())),
                Drain.class).giveBacks();
    }

    /**
     * Closed by JUnit when the test run ends (the root context's store): waits for every give-back, so none is lost
     * when the JVM exits, and throws the first error of one not reported by a test yet (JUnit reports it for the run).
     * CloseableResource, deprecated since JUnit 5.13, is the interface JUnit 5.x and 6.x all close.
     */
    @SuppressWarnings("deprecation")
    private record Drain(GiveBacks giveBacks) implements ExtensionContext.Store.CloseableResource {
        @Override
        public void close() {
            giveBacks.await(DRAIN_WAIT);
        }
    }

    private static void closeConnections(Holder h) throws SQLException {
        for (Connection conn : h.connections) {
            conn.close();
        }
        h.connections.clear();
    }

    @Override
    public boolean supportsParameter(ParameterContext p, ExtensionContext ctx) {
        Class<?> t = p.getParameter().getType();
        return t == DataSource.class || t == Connection.class || t == DatabaseConfig.class || t == TestDatabase.class;
    }

    @Override
    public Object resolveParameter(ParameterContext p, ExtensionContext ctx) {
        Holder h = ctx.getStore(NS).get(Holder.class, Holder.class);
        if (h == null) {
            throw new ParameterResolutionException("pgfork: no database here: with scope METHOD a database exists in"
                    + " test methods and @BeforeEach/@AfterEach; use scope = CLASS for @BeforeAll");
        }
        Class<?> t = p.getParameter().getType();
        if (t == TestDatabase.class) {
            return h.db;
        }
        if (t == DatabaseConfig.class) {
            return h.db.config();
        }
        DataSource ds = Pgfork.dataSource(h.db);
        if (t == DataSource.class) {
            return ds;
        }
        try {
            Connection conn = ds.getConnection();
            h.connections.add(conn);
            return conn;
        } catch (SQLException e) {
            throw new ParameterResolutionException("pgfork: connecting to " + h.db.config() + ": " + e.getMessage(), e);
        }
    }
}
