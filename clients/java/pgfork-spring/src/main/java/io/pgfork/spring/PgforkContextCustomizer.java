package io.pgfork.spring;

import io.pgfork.Migrator;
import io.pgfork.Migrators;
import io.pgfork.Pgfork;
import java.util.Arrays;
import java.util.Map;
import java.util.Objects;
import org.springframework.beans.factory.config.ConfigurableListableBeanFactory;
import org.springframework.beans.factory.support.BeanDefinitionRegistry;
import org.springframework.beans.factory.support.BeanDefinitionRegistryPostProcessor;
import org.springframework.beans.factory.support.RootBeanDefinition;
import org.springframework.context.ConfigurableApplicationContext;
import org.springframework.core.env.ConfigurableEnvironment;
import org.springframework.core.env.MapPropertySource;
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

    private final String[] flyway;
    private final String liquibase;

    PgforkContextCustomizer(String[] flyway, String liquibase) {
        this.flyway = flyway.clone();
        this.liquibase = liquibase;
    }

    @Override
    public void customizeContext(ConfigurableApplicationContext ctx, MergedContextConfiguration merged) {
        ConfigurableEnvironment env = ctx.getEnvironment();
        ctx.addBeanFactoryPostProcessor(new BeanDefinitionRegistryPostProcessor() {
            @Override
            public void postProcessBeanDefinitionRegistry(BeanDefinitionRegistry registry) {
                env.getPropertySources().addFirst(new MapPropertySource("pgfork", Map.of("spring.test.database.replace", "none")));
                if (skipAppMigrations(env) && template(env).appFlyway()) {
                    AppMigrations.skipFlyway(registry);
                }
            }

            @Override
            public void postProcessBeanFactory(ConfigurableListableBeanFactory beanFactory) {
                if (skipAppMigrations(env) && template(env).appLiquibase()) {
                    AppMigrations.skipLiquibase(beanFactory);
                }
            }
        });
        if (!(ctx.getBeanFactory() instanceof BeanDefinitionRegistry registry)) {
            throw new IllegalStateException("pgfork: the test context's bean factory cannot take bean definitions");
        }
        RootBeanDefinition def = new RootBeanDefinition(PgforkDataSource.class,
                () -> new PgforkDataSource(template(env).migrator(), Pgfork.get()));
        def.setPrimary(true);
        def.setDestroyMethodName("close");
        registry.registerBeanDefinition(BEAN, def);
    }

    /** @return whether the application's own Flyway or Liquibase is kept from migrating the copy again at context start */
    static boolean skipAppMigrations(ConfigurableEnvironment env) {
        return env.getProperty(SKIP_APP_MIGRATIONS, Boolean.class, true);
    }

    /**
     * The template's migrations, and whether they are the application's own Flyway migrations or Liquibase changelog
     * (then the copies are already what the application's migration would make of them).
     *
     * @param migrator what migrates the template
     * @param appFlyway the application's Flyway, same locations
     * @param appLiquibase the application's Liquibase, same changelog
     */
    record Template(Migrator migrator, boolean appFlyway, boolean appLiquibase) {
    }

    /** The template's migrations: the annotation's, else the application's Liquibase or Flyway settings. */
    Template template(ConfigurableEnvironment env) {
        String changelog = env.getProperty("spring.liquibase.change-log", "classpath:db/changelog/db.changelog-master.yaml");
        String[] locations = env.getProperty("spring.flyway.locations", String[].class, new String[] {"classpath:db/migration"});
        boolean liquibaseUsed = present("liquibase.Liquibase") && env.getProperty("spring.liquibase.enabled", Boolean.class, true);
        boolean flywayUsed = present("org.flywaydb.core.Flyway") && env.getProperty("spring.flyway.enabled", Boolean.class, true);
        if (!liquibase.isEmpty()) {
            return new Template(Migrators.liquibase(liquibase), false, liquibaseUsed && liquibase.equals(changelog));
        }
        if (flyway.length > 0) {
            return new Template(Migrators.flyway(flyway), flywayUsed && Arrays.equals(flyway, locations), false);
        }
        if (liquibaseUsed && !flywayUsed) {
            return new Template(Migrators.liquibase(changelog), false, true);
        }
        return new Template(Migrators.flyway(locations), flywayUsed, false);
    }

    private static boolean present(String name) {
        try {
            Class.forName(name, false, PgforkContextCustomizer.class.getClassLoader());
            return true;
        } catch (ClassNotFoundException | LinkageError e) {
            return false;
        }
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
