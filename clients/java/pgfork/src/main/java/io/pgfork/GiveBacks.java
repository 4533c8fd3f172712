package io.pgfork;

import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * Gives test databases back without making the next test wait for the server: each give-back (and the closing of
 * the database's pool before it) runs on a background thread, after the ones submitted before it. The first error of
 * a background give-back is kept and thrown by the next {@link #throwError()} or {@link #await}, so it is reported
 * by a test, not lost. The owner calls {@link #await} before the JVM may exit (the threads are daemons): the JUnit 5
 * extension when the test run ends, a Spring test context's DataSource when the context closes.
 */
public final class GiveBacks {
    /** Daemon threads: they never keep a test JVM alive; owners wait for their give-backs with {@link #await}. */
    private static final ExecutorService BACKGROUND = Executors.newCachedThreadPool(r -> {
        Thread t = new Thread(r, "pgfork-give-back");
        t.setDaemon(true);
        return t;
    });

    private final Pgfork pgfork;
    private CompletableFuture<Void> chain = CompletableFuture.completedFuture(null);
    private RuntimeException error;

    /**
     * Give-backs through pgfork.
     *
     * @param pgfork the instance that handed the databases out
     */
    public GiveBacks(Pgfork pgfork) {
        this.pgfork = pgfork;
    }

    /**
     * Gives db back as {@link Pgfork#giveBack} does, without waiting for it: a failed test's database is kept and its
     * URL printed (password masked) now; otherwise it goes back on a background thread, after the give-backs before
     * it. {@code before} (the database's connection pool, or null) is closed first, on that thread too.
     *
     * @param db the database
     * @param testName the test it served, for messages
     * @param failed whether the test failed (the database is kept)
     * @param readOnly whether the test only read (the database goes back unchanged)
     * @param before closed before the give-back, or null
     */
    public synchronized void giveBack(TestDatabase db, String testName, boolean failed, boolean readOnly, AutoCloseable before) {
        if (failed) {
            pgfork.giveBack(db, testName, true, readOnly); // prints now, beside the test's failure; no server call
        }
        chain = chain.handleAsync((ignored, previous) -> {
            try {
                if (before != null) {
                    before.close();
                }
                if (!failed) {
                    pgfork.giveBack(db, testName, false, readOnly);
                }
            } catch (Throwable e) { // every error reaches a test: the threads have no one else to tell
                record(new PgforkException("pgfork: giving back " + db.config() + " (" + testName
                        + ") on a background thread failed: " + e.getMessage(), e));
            }
            return null;
        }, BACKGROUND);
    }

    private synchronized void record(RuntimeException e) {
        if (error == null) {
            error = e;
        } else {
            error.addSuppressed(e);
        }
    }

    /** Throws the first error of a background give-back not thrown yet (the later ones suppressed in it), if any. */
    public synchronized void throwError() {
        RuntimeException e = error;
        if (e != null) {
            error = null;
            throw e;
        }
    }

    /**
     * Waits for every give-back submitted so far, then throws the first error not thrown yet.
     *
     * @param timeout how long to wait at most
     * @throws PgforkException when they take longer, or a give-back failed
     */
    public void await(Duration timeout) {
        CompletableFuture<Void> all;
        synchronized (this) {
            all = chain;
        }
        try {
            all.get(timeout.toMillis(), TimeUnit.MILLISECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new PgforkException("pgfork: interrupted while giving test databases back", e);
        } catch (TimeoutException e) {
            throw new PgforkException("pgfork: giving test databases back took longer than " + timeout.toSeconds()
                    + " s: is pgfork serve (" + pgfork.client().maskedBaseUrl() + ") answering?", e);
        } catch (ExecutionException e) {
            throw new PgforkException("pgfork: giving test databases back: " + e.getCause(), e.getCause()); // not reached: every task catches its errors
        }
        throwError();
    }
}
