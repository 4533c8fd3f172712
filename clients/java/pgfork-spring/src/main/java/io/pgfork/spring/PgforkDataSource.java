package io.pgfork.spring;

import io.pgfork.GiveBacks;
import io.pgfork.Migrator;
import io.pgfork.Pgfork;
import io.pgfork.TestDatabase;
import java.io.PrintWriter;
import java.sql.Connection;
import java.sql.SQLException;
import java.sql.SQLFeatureNotSupportedException;
import java.time.Duration;
import java.util.logging.Logger;
import javax.sql.DataSource;

/**
 * The DataSource a pgfork test context gets: it stands for "the current test database" and hands out connections
 * of whichever copy is current. {@link #refresh} gives the current copy back (kept when its test failed) and the
 * next connection comes from a fresh one, so beans holding this DataSource (JPA, JdbcTemplate, Flyway) need no
 * restart.
 *
 * <p>Giving a copy back costs a test nothing to wait for: the old copy's pool is closed and the copy given back on a
 * background thread ({@link GiveBacks}). The next copy is taken when a connection is first asked for, and that
 * first connection (the take, a new server process, cold catalog caches) is what a refresh costs the next test.
 */
public final class PgforkDataSource implements DataSource, AutoCloseable {
    /** How long closing the context waits for copies still being given back. */
    private static final Duration CLOSE_WAIT = Duration.ofSeconds(60);

    /** A test database with the DataSource (and pool) its connections come from. */
    private record Copy(TestDatabase db, DataSource target, AutoCloseable pool) {
    }

    private final Migrator migrator;
    private final Pgfork pgfork;
    private final GiveBacks giveBacks;
    private Copy current;
    private boolean failed;

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
        giveBacks.throwError();
        if (current == null) {
            return;
        }
        Copy old = current;
        boolean wasFailed = failed;
        current = null;
        failed = false;
        giveBacks.giveBack(old.db(), testName, wasFailed, false, old.pool());
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
