package io.pgfork.spring;

import io.pgfork.Migrator;
import io.pgfork.Pgfork;
import io.pgfork.TestDatabase;
import java.io.PrintWriter;
import java.sql.Connection;
import java.sql.SQLException;
import java.sql.SQLFeatureNotSupportedException;
import java.util.logging.Logger;
import javax.sql.DataSource;

/**
 * The DataSource a pgfork test context gets: it stands for "the current test database" and hands out connections
 * of whichever copy is current. {@link #refresh} gives the current copy back (kept when its test failed) and the
 * next connection comes from a fresh one, so beans holding this DataSource (JPA, JdbcTemplate, Flyway) need no
 * restart.
 */
public final class PgforkDataSource implements DataSource, AutoCloseable {
    private final Migrator migrator;
    private final Pgfork pgfork;
    private TestDatabase db;
    private DataSource target;
    private AutoCloseable pool;
    private boolean failed;

    PgforkDataSource(Migrator migrator, Pgfork pgfork) {
        this.migrator = migrator;
        this.pgfork = pgfork;
    }

    /** @return the current test database (taken now if none is) */
    public synchronized TestDatabase database() {
        current();
        return db;
    }

    private synchronized DataSource current() {
        if (target == null) {
            db = pgfork.take(migrator);
            if (Pools.HIKARI) {
                var h = Pools.hikari(db);
                target = h;
                pool = h;
            } else {
                target = Pgfork.dataSource(db);
                pool = null;
            }
        }
        return target;
    }

    /** Marks the current database as a failed test's: the next refresh keeps it instead of recreating it. */
    synchronized void markFailed() {
        failed = true;
    }

    /**
     * Gives the current database back (kept when its test failed) and closes its pool; the next connection comes
     * from a fresh copy.
     *
     * @param testName the test it served, for the message about a kept database
     */
    public synchronized void refresh(String testName) {
        if (target == null) {
            return;
        }
        try {
            if (pool != null) {
                pool.close();
            }
        } catch (Exception e) {
            throw new IllegalStateException("pgfork: closing the pool of " + db.config() + ": " + e.getMessage(), e);
        }
        TestDatabase old = db;
        boolean wasFailed = failed;
        target = null;
        pool = null;
        db = null;
        failed = false;
        pgfork.giveBack(old, testName, wasFailed, false);
    }

    /** Gives the current database back when the context closes. */
    @Override
    public void close() {
        refresh("the test context");
    }

    @Override
    public Connection getConnection() throws SQLException {
        return current().getConnection();
    }

    @Override
    public Connection getConnection(String username, String password) throws SQLException {
        return current().getConnection(username, password);
    }

    @Override
    public PrintWriter getLogWriter() throws SQLException {
        return current().getLogWriter();
    }

    @Override
    public void setLogWriter(PrintWriter out) throws SQLException {
        current().setLogWriter(out);
    }

    @Override
    public void setLoginTimeout(int seconds) throws SQLException {
        current().setLoginTimeout(seconds);
    }

    @Override
    public int getLoginTimeout() throws SQLException {
        return current().getLoginTimeout();
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
        return current().unwrap(iface);
    }

    @Override
    public boolean isWrapperFor(Class<?> iface) throws SQLException {
        return iface.isInstance(this) || current().isWrapperFor(iface);
    }

    @Override
    public String toString() {
        return "PgforkDataSource[" + (db == null ? "no database yet" : db.config().toString()) + "]";
    }
}
