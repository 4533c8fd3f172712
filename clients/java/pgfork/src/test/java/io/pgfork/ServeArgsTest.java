package io.pgfork;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import org.junit.jupiter.api.Test;

/** PGFORK_SERVE_ARGS split as a POSIX shell splits words, as the other clients' glue splits it. */
class ServeArgsTest {
    @Test
    void splitsAsAShellDoes() {
        assertEquals(List.of("--pool-max", "16", "--db-prefix", "a b", "--x=c d", "e\"f", "g h", "$i"),
                ServeArgs.split("  --pool-max 16 --db-prefix \"a b\" --x='c d' e\\\"f g\\ h '$i'  "));
        assertEquals(List.of(), ServeArgs.split(""));
        assertEquals(List.of(""), ServeArgs.split("''"));
    }

    @Test
    void refusesWhatAShellCannotSplitWithoutShowingIt() {
        for (String bad : List.of("--db-prefix 'secret", "--db-prefix \"secret", "--db-prefix secret\\")) {
            PgforkException e = assertThrows(PgforkException.class, () -> ServeArgs.split(bad));
            assertTrue(e.getMessage().contains("PGFORK_SERVE_ARGS"), e.getMessage());
            assertFalse(e.getMessage().contains("secret"), e.getMessage());
        }
    }
}
