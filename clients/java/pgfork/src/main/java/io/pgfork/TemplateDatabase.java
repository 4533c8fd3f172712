package io.pgfork;

/**
 * The answer to {@link PgforkClient#initializeTemplate(String)}: the empty template database this caller migrates,
 * then finalizes.
 *
 * @param templateHash the template's hash
 * @param config how to connect to it
 */
public record TemplateDatabase(String templateHash, DatabaseConfig config) {
}
