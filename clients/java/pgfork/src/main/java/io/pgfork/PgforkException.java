package io.pgfork;

import java.util.concurrent.CompletionException;

/**
 * Everything pgfork's Java client throws. Ask by behaviour: {@link #isUnreachable()} (no server answered),
 * {@link #status()} (the HTTP status the server answered, 0 when none), {@link #isTemplateTaken()} (another caller
 * builds this template).
 */
public class PgforkException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    private final int status;
    private final boolean unreachable;

    /**
     * An error with a message that says what to do.
     *
     * @param message what went wrong and what to do
     * @param status the HTTP status answered, 0 when none
     * @param unreachable true when no server answered
     * @param cause the cause, or null
     */
    public PgforkException(String message, int status, boolean unreachable, Throwable cause) {
        super(message, cause);
        this.status = status;
        this.unreachable = unreachable;
    }

    /**
     * An error that is not about the server's answer.
     *
     * @param message what went wrong and what to do
     * @param cause the cause, or null
     */
    public PgforkException(String message, Throwable cause) {
        this(message, 0, false, cause);
    }

    /**
     * What to throw for a step that failed on another thread: the cause {@link java.util.concurrent.CompletableFuture#join}
     * wrapped when it is unchecked (a PgforkException that says what to do), else a PgforkException around it.
     *
     * @param e what join threw
     * @return the exception to throw in the caller's thread
     */
    public static RuntimeException unwrap(CompletionException e) {
        Throwable c = e.getCause() == null ? e : e.getCause();
        return c instanceof RuntimeException r ? r : new PgforkException("pgfork: " + c, c);
    }

    /** @return the HTTP status the server answered with, or 0 when there was no answer */
    public int status() {
        return status;
    }

    /** @return true when no server answered at the base URL */
    public boolean isUnreachable() {
        return unreachable;
    }

    /** @return true for initializeTemplate's 423: another caller builds (or built) the template */
    public boolean isTemplateTaken() {
        return status == 423;
    }

    /** @return true for 404: no such template or test database */
    public boolean isNotFound() {
        return status == 404;
    }
}
