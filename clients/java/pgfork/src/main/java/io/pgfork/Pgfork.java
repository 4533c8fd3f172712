package io.pgfork;

import java.util.Collections;
import java.util.IdentityHashMap;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ConcurrentHashMap;
import javax.sql.DataSource;
import org.postgresql.ds.PGSimpleDataSource;

/**
 * A fresh migrated database per test, the library call every integration (JUnit 5, Spring) ends in:
 * {@link #take(Migrator)} builds the template once (in one of all the test JVMs; the others wait for it on the
 * server) and hands out a copy; {@link #giveBack} returns it to be recreated, or keeps it when the test failed.
 * {@link #get()} is the JVM's instance, configured as every pgfork client is (see {@link Settings}); when no server is
 * configured and none answers, it starts {@code pgfork serve} for the run.
 */
public final class Pgfork {
    private static volatile Pgfork instance;

    private final PgforkClient client;
    private final Map<String, CompletableFuture<Void>> templates = new ConcurrentHashMap<>();
    // Each migrator's template hash, computed once: hashing reads every migration file (Flyway's and Liquibase's
    // from the classpath), which cost a take milliseconds per test.
    private final Map<Migrator, String> hashes = Collections.synchronizedMap(new IdentityHashMap<>());

    /**
     * An instance over a client of your own.
     *
     * @param client the client
     */
    public Pgfork(PgforkClient client) {
        this.client = client;
    }

    /** @return this JVM's instance, its server configured or started on first use */
    public static Pgfork get() {
        return get(null);
    }

    /**
     * This JVM's instance, its server configured or started on first use; a server started for the run runs the
     * PostgreSQL major pgMajor, unless the JVM system property {@code pgfork.pg} or the environment's
     * {@code PGFORK_PG} names one (they win). The Spring integration passes its property {@code pgfork.pg}.
     *
     * @param pgMajor the project's PostgreSQL major, e.g. "17", or null for serve's default (the newest PostgreSQL
     *     installed on the system)
     * @return the instance
     * @throws PgforkException when the server started or joined in this JVM runs another major than asked
     */
    public static Pgfork get(String pgMajor) {
        Pgfork p = instance;
        if (p == null) {
            synchronized (Pgfork.class) {
                p = instance;
                if (p == null) {
                    p = new Pgfork(ServeLauncher.client(pgMajor));
                    instance = p;
                }
            }
        }
        String want = Settings.serverConfigured() ? "" : ServeLauncher.pgMajor(pgMajor);
        String got = ServeLauncher.pgVersion();
        if (!want.isEmpty() && !got.isEmpty() && !ServeLauncher.majorOf(got).equals(want)) {
            throw new PgforkException("pgfork: this JVM's pgfork serve runs PostgreSQL " + got + ", and pgfork.pg asks"
                    + " for " + want + ": give every test context of the run the same pgfork.pg", null);
        }
        return p;
    }

    /** @return the client this instance talks through */
    public PgforkClient client() {
        return client;
    }

    /**
     * A fresh database copied from m's template, built first if no JVM has built it. m's migrations are hashed at
     * its first take in this JVM, not again.
     *
     * @param m the migrator
     * @return the test database, the caller's until {@link #giveBack}
     */
    public TestDatabase take(Migrator m) {
        String hash = hashes.computeIfAbsent(m, Migrator::templateHash);
        ensureTemplate(hash, m);
        return client.getTestDatabase(hash);
    }

    /**
     * Makes sure m's template exists on the server: registers it, migrates and finalizes it, or, when another caller
     * registered it first, leaves the waiting to {@link PgforkClient#getTestDatabase}.
     *
     * @param hash the template hash
     * @param m the migrator
     */
    public void ensureTemplate(String hash, Migrator m) {
        CompletableFuture<Void> f = templates.computeIfAbsent(hash, h -> CompletableFuture.runAsync(() -> build(h, m),
                Runnable::run));
        try {
            f.join();
        } catch (CompletionException e) {
            templates.remove(hash, f);
            throw PgforkException.unwrap(e);
        }
    }

    private void build(String hash, Migrator m) {
        TemplateDatabase t;
        try {
            t = client.initializeTemplate(hash);
        } catch (PgforkException e) {
            if (e.isTemplateTaken()) {
                return; // another JVM builds it (or built it); the server makes us wait
            }
            throw e;
        }
        try {
            m.migrate(t.config());
        } catch (Exception e) {
            try {
                client.discardTemplate(hash);
            } catch (PgforkException ignored) {
                // the migration's error is the one to see
            }
            throw new PgforkException("pgfork: migrating template " + hash + " (" + m + ") failed: " + e.getMessage()
                    + "; the template was discarded, fix the migration and run again", e);
        }
        client.finalizeTemplate(hash);
    }

    /**
     * Gives db back: recreated from its template after a passing test (or unlocked unchanged when readOnly), kept
     * when the test failed, its URL printed with the password masked so it can be inspected.
     *
     * @param db the database
     * @param testName the test, for the message
     * @param failed whether the test failed
     * @param readOnly whether the test only read (the database goes back as it is)
     */
    public void giveBack(TestDatabase db, String testName, boolean failed, boolean readOnly) {
        if (failed) {
            System.err.println("pgfork: " + testName + " failed: keeping its database " + db.config()
                    + " (the password is the one pgfork serve hands out; a restart of serve drops kept databases)");
            return;
        }
        if (readOnly) {
            client.unlock(db);
        } else {
            client.recreate(db);
        }
    }

    /**
     * A DataSource of db (the PostgreSQL driver's, no pool: each getConnection opens one).
     *
     * @param db the database
     * @return the DataSource
     */
    public static DataSource dataSource(TestDatabase db) {
        return dataSource(db.config());
    }

    /**
     * A DataSource of a database (the PostgreSQL driver's, no pool).
     *
     * @param c how to connect
     * @return the DataSource
     */
    public static DataSource dataSource(DatabaseConfig c) {
        PGSimpleDataSource ds = new PGSimpleDataSource();
        ds.setUrl(c.jdbcUrl());
        ds.setUser(c.username());
        ds.setPassword(c.password());
        return ds;
    }
}
