package io.pgfork;

/**
 * How a template is made: the files that name it (its hash) and the migration run once on the empty template
 * database. {@link Migrators} has the usual ones (Flyway, Liquibase, a directory of SQL files).
 */
public interface Migrator {
    /**
     * The template hash: changes whenever the migrations change, so a changed migration makes a new template.
     *
     * @return 32 hex digits, as {@link TemplateHash} computes them
     */
    String templateHash();

    /**
     * Migrates the empty template database (runs once per template, in one process of all the test JVMs).
     *
     * @param db the template database
     * @throws Exception when the migration fails: the template is discarded and every waiting test fails with it
     */
    void migrate(DatabaseConfig db) throws Exception;
}
