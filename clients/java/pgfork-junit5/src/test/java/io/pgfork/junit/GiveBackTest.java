package io.pgfork.junit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.platform.engine.discovery.DiscoverySelectors.selectClass;

import io.pgfork.Pgfork;
import io.pgfork.TestDatabase;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.platform.engine.TestExecutionResult;
import org.junit.platform.testkit.engine.EngineExecutionResults;
import org.junit.platform.testkit.engine.EngineTestKit;
import org.junit.platform.testkit.engine.Event;

/**
 * Databases go back on a background thread: the end of the test run waits for the give-backs, and one that fails is
 * reported, not lost.
 */
class GiveBackTest {
    /** Run by the test kit only (its name keeps Surefire from running it on its own). */
    @PgforkTest
    static class GivesItsDatabaseBackItselfExample {
        static TestDatabase seen;

        @Test
        void givesItBackFirst(TestDatabase db) {
            seen = db;
            Pgfork.get().client().recreate(db); // the extension's own give-back of it then fails on the server
        }
    }

    @Test
    void aGiveBackThatFailsInTheBackgroundFailsTheRun() {
        EngineExecutionResults r = EngineTestKit.engine("junit-jupiter")
                .selectors(selectClass(GivesItsDatabaseBackItselfExample.class)).execute();
        r.testEvents().assertStatistics(s -> s.succeeded(1).failed(0));
        // The give-back ran after the test, on another thread; only waiting for it at the run's end can see it fail.
        List<Throwable> errors = r.containerEvents().failed().stream().map(GiveBackTest::error).toList();
        assertEquals(1, errors.size(), "the run (the engine's container) fails: " + errors);
        String msg = messages(errors.get(0)); // JUnit's "Failed to close extension context", ours as its cause
        assertNotNull(GivesItsDatabaseBackItselfExample.seen);
        assertTrue(msg.contains("on a background thread failed") && msg.contains("givesItBackFirst")
                && msg.contains(GivesItsDatabaseBackItselfExample.seen.config().database()), msg);
    }

    private static String messages(Throwable t) {
        StringBuilder sb = new StringBuilder();
        for (Throwable c = t; c != null; c = c.getCause()) {
            sb.append(c.getMessage()).append('\n');
            for (Throwable s : c.getSuppressed()) {
                sb.append(messages(s));
            }
        }
        return sb.toString();
    }

    private static Throwable error(Event e) {
        return e.getRequiredPayload(TestExecutionResult.class).getThrowable().orElseThrow();
    }
}
