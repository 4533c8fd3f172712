package io.pgfork.spring;

import io.pgfork.Migrator;
import io.pgfork.Pgfork;
import io.pgfork.TestDatabase;
import java.io.PrintWriter;
import java.sql.Connection;
import java.sql.SQLException;
import java.sql.SQLFeatureNotSupportedException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.logging.Logger;
import javax.sql.DataSource;

/**
 * The DataSource a pgfork test context gets: it stands for "the current test database" and hands out connections
 * of whichever copy is current. {@link #refresh} gives the current copy back (kept when its test failed) and the
 * next connection comes from a fresh one, so beans holding this DataSource (JPA, JdbcTemplate, Flyway) need no
 * restart.
 *
 * <p>Refreshing costs a test nothing to wait for: the old copy's pool is closed and the copy given back on a
 * background thread; the next copy is taken when a connection is first asked for.
 */
public final class PgforkDataSource implements DataSource, AutoCloseable {
    /** How long closing the context waits for copies still being given back. */
    private static final long CLOSE_WAIT_SECONDS = 60;

    /** Daemon threads for give-backs: they never keep a test JVM alive. */
    private static final ExecutorService BACKGROUND = Executors.newCachedThreadPool(r -> {
        Thread t = new Thread(r, "pgfork-background");
        t.setDaemon(true);
        return t;
    });

    /** A test database with the DataSource (and pool) its connections come from. */
    private record Copy(TestDatabase db, DataSource target, AutoCloseable pool) {
    }

    private final Migrator migrator;
    private final Pgfork pgfork;
    private Copy current;
    private boolean failed;
    private CompletableFuture<Void> handBacks = CompletableFuture.completedFuture(null);
    private RuntimeException backgroundError;

    PgforkDataSource(Migrator migrator, Pgfork pgfork) {
        this.migrator = migrator;
        this.pgfork = pgfork;
    }

    /** @return the current test database (taken now if none is) */
    public synchronized TestDatabase database() {
        return current().db();
    }

    private synchronized Copy current() {
        throwBackgroundError();
        if (current == null) {
            TestDatabase db = pgfork.take(migrator);
            if (Pools.HIKARI) {
                var h = Pools.hikari(db);
                current = new Copy(db, h, h);
            } else {
                current = new Copy(db, Pgfork.dataSource(db), null);
            }
        }
        return current;
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
        throwBackgroundError();
        if (current == null) {
            return;
        }
        Copy old = current;
        boolean wasFailed = failed;
        current = null;
        failed = false;
        handBack(old, testName, wasFailed, false);
    }

    /** Closes c's pool, then gives c back, after the give-backs before it, on a background thread. */
    private void handBack(Copy c, String testName, boolean wasFailed, boolean readOnly) {
        handBacks = handBacks.thenRunAsync(() -> {
            try {
                if (c.pool() != null) {
                    c.pool().close();
                }
                pgfork.giveBack(c.db(), testName, wasFailed, readOnly);
            } catch (Exception e) {
                synchronized (this) {
                    if (backgroundError == null) {
                        backgroundError = new IllegalStateException("pgfork: giving back " + c.db().config() + " (" + testName
                                + "): " + e.getMessage(), e);
                    }
                }
            }
        }, BACKGROUND);
    }

    private void throwBackgroundError() {
        RuntimeException e = backgroundError;
        if (e != null) {
            backgroundError = null;
            throw e;
        }
    }

    /** Gives the current database back when the context closes, and waits for every give-back to reach the server. */
    @Override
    public void close() {
        CompletableFuture<Void> all;
        synchronized (this) {
            if (current != null) {
                Copy old = current;
                current = null;
                handBack(old, "the test context", failed, false);
                failed = false;
            }
            all = handBacks;
        }
        try {
            all.get(CLOSE_WAIT_SECONDS, TimeUnit.SECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } catch (ExecutionException | TimeoutException e) {
            System.err.println("pgfork: giving the test context's databases back: " + e);
        }
        synchronized (this) {
            throwBackgroundError();
        }
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
