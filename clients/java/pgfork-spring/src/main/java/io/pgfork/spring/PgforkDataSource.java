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
import java.util.ArrayList;
import java.util.Collections;
import java.util.IdentityHashMap;
import java.util.List;
import java.util.Set;
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
 * <p>One connection pool (HikariCP when the application has it) serves every copy of the context: a refresh evicts
 * the old copy's connections, and the pool's next ones go to the new copy. Giving a copy back costs a test nothing
 * to wait for: its connections are closed and the copy given back on a background thread ({@link GiveBacks}). Once
 * the context has refreshed, the next copy is made ready ahead, on a background thread while the current one serves
 * its test: taken from the server, with a first connection open (a new server process and its authentication). A
 * refresh then only swaps the copies. Measured (issue 36, bench's java section): taking the copy at the test's first
 * connection and starting a pool for it cost each test 32.8 ms over the floor's, p50. A context holds at most two
 * copies: its current one and the one ready for the next test; that one goes back unchanged when the context closes.
 *
 * <p>Between test classes a context waits in Spring's context cache (up to 32 of them), and a waiting context holds
 * no copy: {@link #park} gives both back when a class ends, and the next test class that uses the context takes a
 * fresh one at its first connection (one take, without the copy made ready ahead: about what a refresh's wait was
 * before copies were made ready ahead). So 20 cached contexts hold the copies of the one that runs, not 40.
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

    /** A test database, the connections opened to it, and one opened ahead for its first use (or none). */
    private static final class Copy {
        final TestDatabase db;
        final Set<Connection> connections = Collections.synchronizedSet(Collections.newSetFromMap(new IdentityHashMap<>()));
        Connection opened;

        Copy(TestDatabase db) {
            this.db = db;
        }

        /** Closes every connection opened to the copy (the pool's own close is then a no-op for them). */
        void closeConnections() throws SQLException {
            List<Connection> all;
            synchronized (connections) {
                all = new ArrayList<>(connections);
            }
            SQLException first = null;
            for (Connection c : all) {
                try {
                    c.close();
                } catch (SQLException e) {
                    first = first == null ? e : first;
                }
            }
            if (first != null) {
                throw first;
            }
        }
    }

    private final Migrator migrator;
    private final Pgfork pgfork;
    private final GiveBacks giveBacks;
    /** Where the pool's connections come from: the current copy. */
    private final DataSource target = new Target();
    /** The pool over target (Hikari), or target itself without one. */
    private final DataSource pool;
    private final AutoCloseable poolCloser;
    private Copy current;
    private boolean failed;
    /** The copy the next test gets, made ready ahead once the context has refreshed; null before. */
    private CompletableFuture<Copy> next;
    private boolean refreshed;
    /** The context waits between test classes ({@link #park}): it holds no copy and its pool opens none. */
    private boolean parked;

    PgforkDataSource(Migrator migrator, Pgfork pgfork) {
        this(migrator, pgfork, null);
    }

    /**
     * @param poolSettings the application's settings by name (the context's Environment), of which the connection
     *     pool takes Spring Boot's {@code spring.datasource.hikari.*}; null for Hikari's and pgfork's defaults
     */
    PgforkDataSource(Migrator migrator, Pgfork pgfork, java.util.function.Function<String, String> poolSettings) {
        this.migrator = migrator;
        this.pgfork = pgfork;
        this.giveBacks = new GiveBacks(pgfork);
        if (Pools.HIKARI) {
            var h = Pools.hikari(target, "pgfork-" + Integer.toHexString(System.identityHashCode(this)), poolSettings);
            pool = h;
            poolCloser = h;
        } else {
            pool = target;
            poolCloser = null;
        }
    }

    /** @return the current test database (taken now if none is) */
    public synchronized TestDatabase database() {
        return current().db;
    }

    private synchronized Copy current() {
        giveBacks.throwError();
        if (parked) { // a test asks: the context is in use again
            parked = false;
            if (poolCloser != null) {
                Pools.fill(poolCloser, true);
            }
        }
        if (current == null) {
            current = next != null ? join(next) : new Copy(pgfork.take(migrator));
            next = null;
            if (refreshed) {
                next = ahead(); // a context that refreshes takes copy after copy: the next one gets ready now
            }
        }
        return current;
    }

    private CompletableFuture<Copy> ahead() {
        return CompletableFuture.supplyAsync(() -> {
            Copy c = new Copy(pgfork.take(migrator));
            try {
                c.opened = connect(c);
            } catch (SQLException | RuntimeException e) {
                giveBacks.giveBack(c.db, "a copy made ready ahead", false, true, null);
                throw new PgforkException("pgfork: connecting to " + c.db.config() + ", made ready for the next test, failed: "
                        + e.getMessage(), e);
            }
            return c;
        }, AHEAD);
    }

    private static Connection connect(Copy c) throws SQLException {
        Connection conn = Pgfork.dataSource(c.db).getConnection();
        c.connections.add(conn);
        return conn;
    }

    private static Copy join(CompletableFuture<Copy> f) {
        try {
            return f.join();
        } catch (CompletionException e) {
            throw PgforkException.unwrap(e);
        }
    }

    /** The pool's source of connections: the one opened ahead for the current copy, else a new one to it. */
    private final class Target implements DataSource {
        @Override
        public Connection getConnection() throws SQLException {
            Copy c;
            synchronized (PgforkDataSource.this) {
                if (parked) { // the pool filling itself, not a test: a parked context takes no copy
                    throw new SQLException("pgfork: the test context waits between test classes and holds no copy");
                }
                c = current();
                if (c.opened != null) {
                    Connection conn = c.opened;
                    c.opened = null;
                    return conn;
                }
            }
            return connect(c);
        }

        @Override
        public Connection getConnection(String username, String password) throws SQLException {
            throw new SQLFeatureNotSupportedException("pgfork: a test database's connections use its own role");
        }

        @Override
        public PrintWriter getLogWriter() {
            return null;
        }

        @Override
        public void setLogWriter(PrintWriter out) {
        }

        @Override
        public void setLoginTimeout(int seconds) {
        }

        @Override
        public int getLoginTimeout() {
            return 0;
        }

        @Override
        public Logger getParentLogger() throws SQLFeatureNotSupportedException {
            throw new SQLFeatureNotSupportedException("pgfork: no parent logger");
        }

        @Override
        public <T> T unwrap(Class<T> iface) throws SQLException {
            throw new SQLException("pgfork: not a wrapper for " + iface.getName());
        }

        @Override
        public boolean isWrapperFor(Class<?> iface) {
            return false;
        }
    }

    /** Marks the current database as a failed test's: the next refresh keeps it instead of recreating it. */
    synchronized void markFailed() {
        failed = true;
    }

    /**
     * Gives the current database back (kept when its test failed): the pool's connections to it are evicted, closed
     * and the copy given back on a background thread; the next connection comes from a fresh copy. An error of the
     * give-back is thrown by the next call.
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
        refreshed = true;
        if (next == null) {
            next = ahead(); // the first refresh: the next test's copy gets ready in the gap before it
        }
        if (poolCloser != null) {
            Pools.evictAll(poolCloser);
        }
        giveBacks.giveBack(old.db, testName, wasFailed, false, old::closeConnections);
    }

    /**
     * Gives back every copy the context holds when a test class ends, as it goes to wait in Spring's context cache
     * (registered by {@link PgforkTestExecutionListener#afterTestClass}): the current copy (recreated, as after a
     * test), the one made ready ahead (unused: back unchanged); the pool's connections are evicted and the pool opens
     * none until a test asks for one. Not for {@link AutoConfigurePgfork.Refresh#NEVER}: that context's one database
     * is its data. The next connection asked for, or {@link #database()}, takes a fresh copy.
     */
    synchronized void park() {
        if (parked) {
            return;
        }
        parked = true;
        if (poolCloser != null) {
            Pools.fill(poolCloser, false);
            Pools.evictAll(poolCloser);
        }
        giveBackCopies();
    }

    /**
     * Gives back the current copy (recreated, or kept when its test failed) and the one made ready ahead (unused:
     * back unchanged); the context then holds none. Called with this held.
     *
     * @throws RuntimeException the error of making the copy ready ahead, after the current one was given back
     */
    private void giveBackCopies() {
        if (current != null) {
            Copy old = current;
            current = null;
            giveBacks.giveBack(old.db, "the test context", failed, false, old::closeConnections);
            failed = false;
        }
        if (next != null) {
            CompletableFuture<Copy> spare = next;
            next = null;
            Copy s = join(spare);
            giveBacks.giveBack(s.db, "the test context's next copy", false, true, s::closeConnections);
        }
    }

    /**
     * Waits for the copy being made ready ahead (if one is) and for every give-back submitted so far: the copies the
     * server counts out are then exactly the ones this context holds. For tests that count them.
     *
     * @throws RuntimeException the error of making the copy ready ahead, or of a give-back
     */
    void awaitBackground() {
        CompletableFuture<Copy> ahead;
        synchronized (this) {
            ahead = next;
        }
        if (ahead != null) {
            join(ahead);
        }
        giveBacks.await(CLOSE_WAIT);
    }

    /** Closes the pool and gives every copy back when the context closes, and waits for them to reach the server. */
    @Override
    public void close() {
        RuntimeException error = null;
        synchronized (this) {
            if (poolCloser != null) {
                try {
                    poolCloser.close();
                } catch (Exception e) {
                    error = new PgforkException("pgfork: closing the test context's connection pool: " + e.getMessage(), e);
                }
            }
            try {
                giveBackCopies();
            } catch (RuntimeException e) {
                error = error == null ? e : error;
            }
        }
        giveBacks.await(CLOSE_WAIT);
        if (error != null) {
            throw error;
        }
    }

    /**
     * A connection to the current copy, from the pool; one the pool opened to a copy since given back (while a
     * refresh evicted the rest) is evicted, not handed out.
     */
    @Override
    public Connection getConnection() throws SQLException {
        for (int i = 0; i < 8; i++) {
            Copy c = current(); // on the caller's thread: a take's error reaches the test
            Connection conn = pool.getConnection();
            if (poolCloser == null || c.connections.contains(conn.unwrap(Connection.class))) {
                return conn;
            }
            Pools.evict(poolCloser, conn);
        }
        throw new SQLException("pgfork: the connection pool kept handing out connections to copies given back");
    }

    @Override
    public Connection getConnection(String username, String password) throws SQLException {
        throw new SQLFeatureNotSupportedException("pgfork: a test database's connections use its own role (call getConnection())");
    }

    @Override
    public PrintWriter getLogWriter() throws SQLException {
        return pool.getLogWriter();
    }

    @Override
    public void setLogWriter(PrintWriter out) throws SQLException {
        pool.setLogWriter(out);
    }

    @Override
    public void setLoginTimeout(int seconds) throws SQLException {
        pool.setLoginTimeout(seconds);
    }

    @Override
    public int getLoginTimeout() throws SQLException {
        return pool.getLoginTimeout();
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
        return pool.unwrap(iface);
    }

    @Override
    public boolean isWrapperFor(Class<?> iface) throws SQLException {
        return iface.isInstance(this) || pool.isWrapperFor(iface);
    }

    @Override
    public synchronized String toString() {
        return "PgforkDataSource[" + (current == null ? "no database yet" : current.db.config().toString()) + "]";
    }
}
