package io.pgfork;

/**
 * A test database handed out by {@link PgforkClient#getTestDatabase(String)}: a copy of the template that is this
 * test's alone until it is given back.
 *
 * @param templateHash the template it was copied from
 * @param id the small number in its name
 * @param token the v2 hand-out id, {@code null} on IntegreSQL's v1 API
 * @param config how to connect to it
 */
public record TestDatabase(String templateHash, int id, String token, DatabaseConfig config) {
    /** The printable form: the template, the number and the URL with its password masked. */
    @Override
    public String toString() {
        return "TestDatabase[" + templateHash + "#" + id + " " + config + "]";
    }
}
