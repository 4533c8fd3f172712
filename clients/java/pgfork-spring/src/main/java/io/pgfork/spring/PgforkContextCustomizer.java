package io.pgfork.spring;

import io.pgfork.Migrator;
import io.pgfork.Migrators;
import io.pgfork.Pgfork;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.Supplier;
import org.springframework.beans.factory.config.ConfigurableListableBeanFactory;
import org.springframework.beans.factory.support.BeanDefinitionRegistry;
import org.springframework.beans.factory.support.BeanDefinitionRegistryPostProcessor;
import org.springframework.beans.factory.support.RootBeanDefinition;
import org.springframework.context.ConfigurableApplicationContext;
import org.springframework.core.env.ConfigurableEnvironment;
import org.springframework.core.env.MapPropertySource;
import org.springframework.core.io.Resource;
import org.springframework.test.context.ContextCustomizer;
import org.springframework.test.context.MergedContextConfiguration;

/**
 * Puts a {@link PgforkDataSource} into a test context as its primary DataSource (Spring Boot's own then backs off)
 * and turns off the test slices' embedded-database replacement ({@code spring.test.database.replace=none}, set when
 * the context refreshes, after every other customizer, so {@code @DataJpaTest}'s default cannot win over it). When the
 * template was migrated by the application's own Flyway locations or Liquibase changelog, the application's Flyway or
 * Liquibase does not migrate the copy again at context start ({@link AppMigrations}; {@code pgfork.skip-app-migrations=false}
 * lets it).
 */
final class PgforkContextCustomizer implements ContextCustomizer {
    /** The DataSource's bean name. */
    static final String BEAN = "pgforkDataSource";
    /** The property that, set to false, lets the application's Flyway or Liquibase run at context start as without pgfork. */
    static final String SKIP_APP_MIGRATIONS = "pgfork.skip-app-migrations";
    /**
     * The PostgreSQL major of a {@code pgfork serve} started for the run, e.g. 17 (installed when missing); the JVM
     * system property and the environment's {@code PGFORK_PG} win.
     */
    static final String PG_MAJOR = "pgfork.pg";

    private final String[] flyway;
    private final String liquibase;

    PgforkContextCustomizer(String[] flyway, String liquibase) {
        this.flyway = flyway.clone();
        this.liquibase = liquibase;
    }

    @Override
    public void customizeContext(ConfigurableApplicationContext ctx, MergedContextConfiguration merged) {
        ConfigurableEnvironment env = ctx.getEnvironment();
        ClassLoader loader = ctx.getClassLoader() != null ? ctx.getClassLoader() : PgforkContextCustomizer.class.getClassLoader();
        // Chosen once, when the context refreshes and before spring.sql.init.mode=never below hides the SQL scripts.
        AtomicReference<Template> chosen = new AtomicReference<>();
        Supplier<Template> template = () -> chosen.updateAndGet(t -> t != null ? t : template(env, loader));
        ctx.addBeanFactoryPostProcessor(new BeanDefinitionRegistryPostProcessor() {
            @Override
            public void postProcessBeanDefinitionRegistry(BeanDefinitionRegistry registry) {
                Map<String, Object> props = new HashMap<>();
                props.put("spring.test.database.replace", "none");
                boolean skip = skipAppMigrations(env);
                if (skip && template.get().appSqlInit()) {
                    props.put("spring.sql.init.mode", "never"); // the copy already ran the scripts, in its template
                }
                env.getPropertySources().addFirst(new MapPropertySource("pgfork", props));
            }

            @Override
            public void postProcessBeanFactory(ConfigurableListableBeanFactory beanFactory) {
                // After every registry post-processor (configuration classes, auto-configuration): the application's
                // own migration strategy, if any, is registered by now.
                if (skipAppMigrations(env) && template.get().appFlyway()) {
                    AppMigrations.skipFlyway(beanFactory);
                }
                if (skipAppMigrations(env) && template.get().appLiquibase()) {
                    AppMigrations.skipLiquibase(beanFactory);
                }
            }
        });
        if (!(ctx.getBeanFactory() instanceof BeanDefinitionRegistry registry)) {
            throw new IllegalStateException("pgfork: the test context's bean factory cannot take bean definitions");
        }
        RootBeanDefinition def = new RootBeanDefinition(PgforkDataSource.class,
                () -> new PgforkDataSource(template.get().migrator(), Pgfork.get(env.getProperty(PG_MAJOR)), env::getProperty));
        def.setPrimary(true);
        def.setDestroyMethodName("close");
        registry.registerBeanDefinition(BEAN, def);
    }

    /** @return whether the application's own Flyway or Liquibase is kept from migrating the copy again at context start */
    static boolean skipAppMigrations(ConfigurableEnvironment env) {
        return env.getProperty(SKIP_APP_MIGRATIONS, Boolean.class, true);
    }

    /**
     * The template's migrations (a Liquibase changelog, else Flyway locations, then or else the application's Spring
     * SQL init scripts), and whether they are the application's own (then the copies are already what the
     * application's Flyway, Liquibase or SQL init would make of them). The migrator is made only when asked for: it
     * fails when neither Flyway nor Liquibase is on the classpath.
     *
     * @param liquibase the changelog, or null for Flyway
     * @param flyway the Flyway locations (when liquibase is null), or null for SQL init scripts alone
     * @param app whether they are the application's own Liquibase changelog or Flyway locations
     * @param sqlInit the application's SQL init scripts, run after Liquibase or Flyway as Boot runs them, or null
     */
    record Template(String liquibase, List<String> flyway, boolean app, Migrator sqlInit) {
        Template(String liquibase, List<String> flyway, boolean app) {
            this(liquibase, flyway, app, null);
        }

        Migrator migrator() {
            Migrator tool = liquibase != null ? Migrators.liquibase(liquibase)
                    : flyway != null ? Migrators.flyway(flyway.toArray(String[]::new)) : null;
            if (sqlInit == null) {
                return tool;
            }
            return tool == null ? sqlInit : Migrators.sequence(tool, sqlInit);
        }

        boolean appFlyway() {
            return app && liquibase == null && flyway != null;
        }

        /** @return whether the template ran the application's Spring SQL init scripts (spring.sql.init) */
        boolean appSqlInit() {
            return sqlInit != null;
        }

        boolean appLiquibase() {
            return app && liquibase != null;
        }

        /**
         * @return this template with the application's SQL init scripts after its migrations, when they are the
         *     application's own and Boot would run the scripts after them against PostgreSQL ({@link SqlInitScripts#alongside})
         */
        Template withSqlInit(ConfigurableEnvironment env, ClassLoader loader) {
            if (!app || sqlInit != null || !SqlInitScripts.alongside(env)) {
                return this;
            }
            List<Resource> scripts = SqlInitScripts.scripts(env, loader);
            return scripts.isEmpty() ? this : new Template(liquibase, flyway, app, SqlInitScripts.migrator(env, scripts));
        }
    }

    /**
     * The template's migrations: the annotation's, else the application's Liquibase or Flyway settings, else (neither
     * used) the application's Spring SQL init scripts when there are any. The application's own Liquibase or Flyway
     * is followed by its SQL init scripts when Boot would run those too ({@code spring.sql.init.mode=always}).
     */
    Template template(ConfigurableEnvironment env) {
        return template(env, PgforkContextCustomizer.class.getClassLoader());
    }

    /** The template's migrations, SQL init scripts looked up with loader. */
    Template template(ConfigurableEnvironment env, ClassLoader loader) {
        String changelog = env.getProperty("spring.liquibase.change-log", "classpath:db/changelog/db.changelog-master.yaml");
        String[] locations = env.getProperty("spring.flyway.locations", String[].class, new String[] {"classpath:db/migration"});
        boolean liquibaseUsed = Classpath.has("liquibase.Liquibase") && env.getProperty("spring.liquibase.enabled", Boolean.class, true);
        boolean flywayUsed = Classpath.has("org.flywaydb.core.Flyway") && env.getProperty("spring.flyway.enabled", Boolean.class, true);
        if (!liquibase.isEmpty()) {
            return new Template(liquibase, null, liquibaseUsed && liquibase.equals(changelog)).withSqlInit(env, loader);
        }
        if (flyway.length > 0) {
            return new Template(null, List.of(flyway), flywayUsed && Arrays.equals(flyway, locations)).withSqlInit(env, loader);
        }
        if (liquibaseUsed && !flywayUsed) {
            return new Template(changelog, null, true).withSqlInit(env, loader);
        }
        if (!flywayUsed && !liquibaseUsed && SqlInitScripts.used(env)) {
            List<Resource> scripts = SqlInitScripts.scripts(env, loader);
            if (!scripts.isEmpty()) {
                return new Template(null, null, true, SqlInitScripts.migrator(env, scripts));
            }
        }
        return new Template(null, List.of(locations), flywayUsed).withSqlInit(env, loader);
    }


    @Override
    public boolean equals(Object o) {
        return o instanceof PgforkContextCustomizer c && Arrays.equals(flyway, c.flyway) && liquibase.equals(c.liquibase);
    }

    @Override
    public int hashCode() {
        return Objects.hash(Arrays.hashCode(flyway), liquibase);
    }
}
