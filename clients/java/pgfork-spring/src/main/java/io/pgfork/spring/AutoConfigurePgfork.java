package io.pgfork.spring;

import java.lang.annotation.Documented;
import java.lang.annotation.ElementType;
import java.lang.annotation.Inherited;
import java.lang.annotation.Retention;
import java.lang.annotation.RetentionPolicy;
import java.lang.annotation.Target;

/**
 * Replaces the application's {@code DataSource} in a Spring test context with a pgfork test database, a copy of a
 * template migrated once by the application's own Flyway locations ({@code spring.flyway.locations}) or Liquibase
 * changelog ({@code spring.liquibase.change-log}), or by what this annotation names. Works with
 * {@code @SpringBootTest}, {@code @DataJpaTest} and {@code @JdbcTest} (the test slices' embedded-database replacement
 * is turned off for it):
 *
 * <pre>{@code
 * @SpringBootTest
 * @AutoConfigurePgfork
 * class OrderServiceTest { ... }
 * }</pre>
 *
 * The database behind the context's DataSource is swapped after each test method (or class) while the context
 * itself stays cached: contexts are shared between test classes as Spring shares them, only the database changes.
 * A failing test's database is kept and its URL printed with the password masked. Entities should use identity
 * columns (or sequences allocating one at a time): a Hibernate pooled sequence optimizer keeps values in memory
 * across a refresh.
 *
 * <p>When the template's migrations are the application's own, the application's Flyway or Liquibase does not
 * migrate the copy again when the context starts (its beans stay); the property
 * {@code pgfork.skip-app-migrations=false} lets it.
 */
@Target(ElementType.TYPE)
@Retention(RetentionPolicy.RUNTIME)
@Documented
@Inherited
public @interface AutoConfigurePgfork {
    /** @return when the database is replaced by a fresh copy */
    Refresh refresh() default Refresh.AFTER_EACH_TEST_METHOD;

    /** @return Flyway locations of the template (default: {@code spring.flyway.locations}, else {@code classpath:db/migration}) */
    String[] flyway() default {};

    /** @return a Liquibase changelog of the template (default: {@code spring.liquibase.change-log} when Liquibase is used) */
    String liquibase() default "";

    /** When a test context's database is replaced by a fresh copy. */
    enum Refresh {
        /** After every test method: each test starts from the migrated template. */
        AFTER_EACH_TEST_METHOD,
        /** After every test class: the class's tests share one database. */
        AFTER_CLASS,
        /** Never: one database for the context's whole life. */
        NEVER
    }
}
