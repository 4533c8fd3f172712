package io.pgfork.junit;

import java.lang.annotation.Documented;
import java.lang.annotation.ElementType;
import java.lang.annotation.Inherited;
import java.lang.annotation.Retention;
import java.lang.annotation.RetentionPolicy;
import java.lang.annotation.Target;
import org.junit.jupiter.api.extension.ExtendWith;

/**
 * A fresh migrated PostgreSQL database from {@code pgfork serve} for each test method (or the whole class), injected
 * as a {@code DataSource}, {@code Connection}, {@code DatabaseConfig} or {@code TestDatabase} parameter:
 *
 * <pre>{@code
 * @PgforkTest(flyway = "classpath:db/migration")
 * class BookRepositoryTest {
 *     @Test
 *     void saves(DataSource ds) throws SQLException { ... }
 * }
 * }</pre>
 *
 * The template is migrated once (by Flyway, Liquibase or plain SQL files, keyed by the migration files' content),
 * in one of all the test JVMs of the run. A failing test's database is kept and its URL printed (password masked).
 * With none of flyway, liquibase and sql given, Flyway's default location {@code classpath:db/migration} is used.
 */
@Target(ElementType.TYPE)
@Retention(RetentionPolicy.RUNTIME)
@Documented
@Inherited
@ExtendWith(PgforkExtension.class)
public @interface PgforkTest {
    /** @return Flyway locations, e.g. {@code classpath:db/migration} */
    String[] flyway() default {};

    /** @return a Liquibase changelog on the classpath, e.g. {@code db/changelog/db.changelog-master.yaml} */
    String liquibase() default "";

    /** @return a directory of plain SQL files, run in name order (relative to the working directory) */
    String sql() default "";

    /** @return a database per test method (default) or one for the whole class */
    Scope scope() default Scope.METHOD;

    /** @return the tests only read: databases go back unchanged instead of being recreated */
    boolean readOnly() default false;

    /** How long one database lives. */
    enum Scope {
        /** A fresh database for every test method. */
        METHOD,
        /** One database for all the test methods of the class (and its @BeforeAll). */
        CLASS
    }
}
