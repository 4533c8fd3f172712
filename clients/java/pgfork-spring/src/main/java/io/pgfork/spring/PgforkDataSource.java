package io.pgfork.spring;

import io.pgfork.GiveBacks;
import io.pgfork.Migrator;
import io.pgfork.Pgfork;
import io.pgfork.PgforkException;
import io.pgfork.TestDatabase;
import java.io.PrintWriter;
import java.sql.Connection;
import java.sql.SQLException;
import java.sql.SQLFeatureNotSupportedException;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.logging.Logger;
import javax.sql.DataSource;

/**
 * The DataSource a pgfork test context gets: it stands for "the current test database" and hands out connections
 * of whichever copy is current. {@link #refresh} gives the current copy back (kept when its test failed) and the
 * next connection comes from a fresh one, so beans holding this DataSource (JPA, JdbcTemplate, Flyway) need no
 * restart.
 *
 * <p>Giving a copy back costs a test nothing to wait for: the old copy's pool is closed and the copy given back on a
 * background thread ({@link GiveBacks}). Once the context has refreshed, the next copy is made ready ahead, on a
 * background thread while the current one serves its test: taken from the server, its pool started and its first
 * connection open (a new server process and its authentication). A refresh then only swaps the copies. Measured
 * (issue 36, bench's java section): taking the copy at the test's first connection cost each test 32.8 ms over the
 * floor's, p50; most of it the pool's start and first connection (11.7–17.2 ms), which a ready copy has behind it.
 * A context holds at most two copies: its current one and the one ready for the next test; the spare goes back
 * unchanged when the context closes.
 */
public final class PgforkDataSource implements DataSource, AutoCloseable {
    /** How long closing the context waits for copies still being given back. */
    private static final Duration CLOSE_WAIT = Duration.ofSeconds(60);

    /** Daemon threads that make the next copies ready; a context waits for its own before it closes. */
    private static final ExecutorService AHEAD = Executors.newCachedThreadPool(r -> {
        Thread t = new Thread(r, "pgfork-next-copy");
        t.setDaemon(true);
        return t;
    });

    /** A test database with the DataSource (and pool) its connections come from. */
    private record Copy(TestDatabase db, DataSource target, AutoCloseable pool) {
    }

    private final Migrator migrator;
    private final Pgfork pgfork;
    private final GiveBacks giveBacks;
    private Copy current;
    private boolean failed;
    /** The copy the next test gets, made ready ahead once the context has refreshed; null before. */
    private CompletableFuture<Copy> next;
    private boolean refreshed;

    PgforkDataSource(Migrator migrator, Pgfork pgfork) {
        this.migrator = migrator;
        this.pgfork = pgfork;
        this.giveBacks = new GiveBacks(pgfork);
    }

    /** @return the current test database (taken now if none is) */
    public synchronized TestDatabase database() {
        return current().db();
    }

    private synchronized Copy current() {
        giveBacks.throwError();
        if (current == null) {
            current = next != null ? join(next) : open(false);
            next = null;
            if (refreshed) {
                next = ahead(); // a context that refreshes takes copy after copy: the next one gets ready now
            }
        }
        return current;
    }

    /** Takes a copy and wraps it in a pool; when started, the pool opens its first connection now. */
    private Copy open(boolean started) {
        TestDatabase db = pgfork.take(migrator);
        if (!Pools.HIKARI) {
            return new Copy(db, Pgfork.dataSource(db), null);
        }
        var h = Pools.hikari(db);
        if (started) {
            try {
                h.getConnection().close(); // starts the pool; its connection stays idle in it (minimumIdle 1)
            } catch (SQLException | RuntimeException e) {
                h.close();
                giveBacks.giveBack(db, "a copy made ready ahead", false, true, null);
                throw new PgforkException("pgfork: connecting to " + db.config() + ", made ready for the next test, failed: "
                        + e.getMessage(), e);
            }
        }
        return new Copy(db, h, h);
    }

    private CompletableFuture<Copy> ahead() {
        return CompletableFuture.supplyAsync(() -> open(true), AHEAD);
    }

    private static Copy join(CompletableFuture<Copy> f) {
        try {
            return f.join();
        } catch (CompletionException e) {
            throw e.getCause() instanceof RuntimeException r ? r : new PgforkException("pgfork: " + e.getCause(), e.getCause());
        }
    }

    /** Marks the current database as a failed test's: the next refresh keeps it instead of recreating it. */
    synchronized void markFailed() {
        failed = true;
    }

    /**
     * Gives the current database back (kept when its test failed) and closes its pool, both on a background thread;
     * the next connection comes from a fresh copy. An error of the give-back is thrown by the next call.
     *
     * @param testName the test it served, for the message about a kept database
     */
    public synchronized void refresh(String testName) {
        giveBacks.throwError();
        if (current == null) {
            return;
        }
        Copy old = current;
        boolean wasFailed = failed;
        current = null;
        failed = false;
        giveBacks.giveBack(old.db(), testName, wasFailed, false, old.pool());
        refreshed = true;
        if (next == null) {
            next = ahead(); // the first refresh: the next test's copy gets ready in the gap before it
        }
    }

    /** Gives the current database back when the context closes, and waits for every give-back to reach the server. */
    @Override
    public void close() {
        synchronized (this) {
            if (current != null) {
                Copy old = current;
                current = null;
                giveBacks.giveBack(old.db(), "the test context", failed, false, old.pool());
                failed = false;
            }
            if (next != null) {
                CompletableFuture<Copy> spare = next;
                next = null;
                try {
                    Copy s = join(spare);
                    giveBacks.giveBack(s.db(), "the test context's next copy", false, true, s.pool()); // unused: back unchanged
                } catch (RuntimeException e) {
                    giveBacks.await(CLOSE_WAIT);
                    throw e;
                }
            }
        }
        giveBacks.await(CLOSE_WAIT);
    }

    @Override
    public Connection getConnection() throws SQLException {
        return current().target().getConnection();
    }

    @Override
    public Connection getConnection(String username, String password) throws SQLException {
        return current().target().getConnection(username, password);
    }

    @Override
    public PrintWriter getLogWriter() throws SQLException {
        return current().target().getLogWriter();
    }

    @Override
    public void setLogWriter(PrintWriter out) throws SQLException {
        current().target().setLogWriter(out);
    }

    @Override
    public void setLoginTimeout(int seconds) throws SQLException {
        current().target().setLoginTimeout(seconds);
    }

    @Override
    public int getLoginTimeout() throws SQLException {
        return current().target().getLoginTimeout();
    }

    @Override
    public Logger getParentLogger() throws SQLFeatureNotSupportedException {
        throw new SQLFeatureNotSupportedException("pgfork: no parent logger");
    }

    @Override
    public <T> T unwrap(Class<T> iface) throws SQLException {
        if (iface.isInstance(this)) {
            return iface.cast(this);
        }
        return current().target().unwrap(iface);
    }

    @Override
    public boolean isWrapperFor(Class<?> iface) throws SQLException {
        return iface.isInstance(this) || current().target().isWrapperFor(iface);
    }

    @Override
    public String toString() {
        return "PgforkDataSource[" + (current == null ? "no database yet" : current.db().config().toString()) + "]";
    }
}
