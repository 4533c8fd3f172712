package io.pgfork;

import java.sql.Connection;
import liquibase.Scope;
import liquibase.command.CommandScope;
import liquibase.database.Database;
import liquibase.database.DatabaseFactory;
import liquibase.database.jvm.JdbcConnection;
import liquibase.resource.ClassLoaderResourceAccessor;

/** A Liquibase changelog on the classpath; loaded only when Liquibase is on the classpath. */
final class LiquibaseMigrator implements Migrator {
    private final String changelog;

    LiquibaseMigrator(String changelog) {
        this.changelog = changelog.replaceFirst("^classpath:", "").replaceAll("^/+", "");
    }

    @Override
    public String templateHash() {
        int slash = changelog.lastIndexOf('/');
        String dir = slash < 0 ? "" : changelog.substring(0, slash);
        ClassLoader cl = Thread.currentThread().getContextClassLoader();
        java.util.Map<String, byte[]> files;
        if (dir.isEmpty()) { // a changelog at the classpath's top: hash it alone, not the whole classpath
            try (java.io.InputStream in = cl.getResourceAsStream(changelog)) {
                if (in == null) {
                    throw new PgforkException("pgfork: Liquibase changelog " + changelog + " is not on the classpath", null);
                }
                files = java.util.Map.of(changelog, in.readAllBytes());
            } catch (java.io.IOException e) {
                throw new java.io.UncheckedIOException(e);
            }
        } else {
            files = ClasspathFiles.of("classpath:" + dir, cl);
        }
        return TemplateHash.ofFiles(files, "liquibase\n" + changelog);
    }

    @Override
    public void migrate(DatabaseConfig db) throws Exception {
        ClassLoader cl = Thread.currentThread().getContextClassLoader();
        try (Connection c = Migrators.connect(db)) {
            Database database = DatabaseFactory.getInstance().findCorrectDatabaseImplementation(new JdbcConnection(c));
            Scope.child(Scope.Attr.resourceAccessor.name(), new ClassLoaderResourceAccessor(cl), () ->
                    new CommandScope("update")
                            .addArgumentValue("database", database)
                            .addArgumentValue("changelogFile", changelog)
                            .execute());
        }
    }

    @Override
    public String toString() {
        return "Liquibase " + changelog;
    }
}
