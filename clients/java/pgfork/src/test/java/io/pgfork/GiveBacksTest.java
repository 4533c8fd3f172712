package io.pgfork;

import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import org.junit.jupiter.api.Test;

/** Give-backs on a background thread, against the live server: not waited for, in order, waited for by await. */
class GiveBacksTest {
    private static final Pgfork PG = Pgfork.get();
    private static final Migrator COLOURS = Migrators.sqlFiles(Path.of("src/test/resources/sql"));

    @Test
    void aGiveBackIsNotWaitedForAndAwaitWaitsForAllInOrder() {
        TestDatabase a = PG.take(COLOURS);
        TestDatabase b = PG.take(COLOURS);
        GiveBacks g = new GiveBacks(PG);
        List<String> closed = new CopyOnWriteArrayList<>();
        // A slow pool close, as Hikari's can be: it ends only once both
        // give-backs returned, so giving back that waited for it would make
        // it wait out its minute (a clock around the calls judged the load).
        CountDownLatch returned = new CountDownLatch(1);
        AtomicBoolean waitedFor = new AtomicBoolean();
        g.giveBack(a, "a", false, false, () -> {
            waitedFor.set(!returned.await(60, TimeUnit.SECONDS));
            closed.add("a");
        });
        g.giveBack(b, "b", false, true, () -> closed.add("b"));
        returned.countDown();
        g.await(Duration.ofSeconds(120));
        assertFalse(waitedFor.get(), "giving back waited for the close instead of returning at once");
        assertEquals(List.of("a", "b"), closed, "await waited for both, in the order given");
        // Both reached the server: their hand-outs are over, so giving them back again is refused.
        assertThrows(PgforkException.class, () -> PG.client().recreate(a));
        assertThrows(PgforkException.class, () -> PG.client().unlock(b));
    }

    @Test
    void aFailedGiveBackIsThrownOnceByTheNextCall() {
        TestDatabase db = PG.take(COLOURS);
        PG.client().recreate(db); // given back already: the background give-back below fails on the server
        GiveBacks g = new GiveBacks(PG);
        g.giveBack(db, "twice", false, false, null);
        PgforkException e = assertThrows(PgforkException.class, () -> g.await(Duration.ofSeconds(30)));
        assertTrue(e.getMessage().contains("twice") && e.getMessage().contains("on a background thread failed")
                && e.getMessage().contains(db.config().database()), e.getMessage());
        assertTrue(e.getCause() instanceof PgforkException, "the server's answer is the cause: " + e.getCause());
        assertDoesNotThrow(g::throwError, "reported once");
        assertDoesNotThrow(() -> g.await(Duration.ofSeconds(1)));
    }
}
