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
 * the context refreshes, after every other customizer, so {@code @DataJpaTest}'s default cannot win over it).
 */
final class PgforkContextCustomizer implements ContextCustomizer {
    /** The DataSource's bean name. */
    static final String BEAN = "pgforkDataSource";

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
            }

            @Override
            public void postProcessBeanFactory(ConfigurableListableBeanFactory beanFactory) {
                // nothing: the property above is all
            }
        });
        if (!(ctx.getBeanFactory() instanceof BeanDefinitionRegistry registry)) {
            throw new IllegalStateException("pgfork: the test context's bean factory cannot take bean definitions");
        }
        RootBeanDefinition def = new RootBeanDefinition(PgforkDataSource.class,
                () -> new PgforkDataSource(migrator(env), Pgfork.get()));
        def.setPrimary(true);
        def.setDestroyMethodName("close");
        registry.registerBeanDefinition(BEAN, def);
    }

    /** The template's migrator: the annotation's, else the application's Liquibase or Flyway settings. */
    Migrator migrator(ConfigurableEnvironment env) {
        if (!liquibase.isEmpty()) {
            return Migrators.liquibase(liquibase);
        }
        if (flyway.length > 0) {
            return Migrators.flyway(flyway);
        }
        String changelog = env.getProperty("spring.liquibase.change-log");
        boolean liquibaseUsed = present("liquibase.Liquibase") && env.getProperty("spring.liquibase.enabled", Boolean.class, true);
        boolean flywayUsed = present("org.flywaydb.core.Flyway") && env.getProperty("spring.flyway.enabled", Boolean.class, true);
        if (liquibaseUsed && !flywayUsed) {
            return Migrators.liquibase(changelog != null ? changelog : "classpath:db/changelog/db.changelog-master.yaml");
        }
        String[] locations = env.getProperty("spring.flyway.locations", String[].class, new String[] {"classpath:db/migration"});
        return Migrators.flyway(locations);
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
