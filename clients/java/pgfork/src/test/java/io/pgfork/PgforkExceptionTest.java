package io.pgfork;

import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import org.junit.jupiter.api.Test;

class PgforkExceptionTest {
    @Test
    void unwrapRethrowsWhatTheOtherThreadThrew() {
        PgforkException said = new PgforkException("pgfork: the server says what to do", null);
        CompletableFuture<Void> f = CompletableFuture.runAsync(() -> {
            throw said;
        });
        CompletionException e = assertThrows(CompletionException.class, f::join);
        assertSame(said, PgforkException.unwrap(e));
    }

    @Test
    void unwrapWrapsACheckedCause() {
        IOException io = new IOException("disk full");
        RuntimeException r = PgforkException.unwrap(new CompletionException(io));
        assertInstanceOf(PgforkException.class, r);
        assertSame(io, r.getCause());
        assertTrue(r.getMessage().contains("disk full"), r.getMessage());
    }
}
