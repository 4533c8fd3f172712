package io.pgfork.spring;

import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.lang.reflect.Proxy;
import org.springframework.beans.BeansException;
import org.springframework.beans.factory.config.BeanDefinition;
import org.springframework.beans.factory.config.BeanPostProcessor;
import org.springframework.beans.factory.config.ConfigurableListableBeanFactory;
import org.springframework.beans.factory.support.BeanDefinitionRegistry;
import org.springframework.beans.factory.support.RootBeanDefinition;

/**
 * Keeps the application's own Flyway or Liquibase from migrating a pgfork copy again when the context starts: the
 * copy's template was migrated with the same locations or changelog, so all that run would do is read and validate
 * every migration (seconds per context for a schema of many migrations). The application's {@code Flyway} and
 * {@code SpringLiquibase} beans stay, injectable and configured as the application configures them.
 *
 * <p>Spring Boot runs Flyway through a {@code FlywayMigrationStrategy} bean when there is one: pgfork registers one
 * that does nothing, once every other bean definition is in and only when the application or test defines none, so a
 * strategy of theirs wins over it. (Not as a fallback bean: {@code setFallback} is Spring Framework 6.2's, and Boot
 * 3.2-3.4 run on 6.1, where it failed every context with {@code NoSuchMethodError}.) Boot 4 has the
 * interface in {@code org.springframework.boot.flyway.autoconfigure} (module spring-boot-flyway), Boot 3.5 in
 * {@code org.springframework.boot.autoconfigure.flyway}; it is looked up by name, so neither is needed to compile.
 * Liquibase's {@code SpringLiquibase} gets {@code setShouldRun(false)} before it initializes.
 */
final class AppMigrations {
    /** Spring Boot's FlywayMigrationStrategy in Boot 4.0 and in Boot 3.5. */
    private static final String[] FLYWAY_STRATEGIES = {
        "org.springframework.boot.flyway.autoconfigure.FlywayMigrationStrategy",
        "org.springframework.boot.autoconfigure.flyway.FlywayMigrationStrategy",
    };
    private static final String SPRING_LIQUIBASE = "liquibase.integration.spring.SpringLiquibase";
    /** The no-op strategy's bean name (the Boot 3.5 one gets a suffix if both are present). */
    static final String FLYWAY_STRATEGY_BEAN = "pgforkSkipFlywayMigrate";

    private AppMigrations() {
    }

    /**
     * Registers a FlywayMigrationStrategy that does not migrate for each Boot's interface present, unless the context
     * defines one of its own. Called from a bean factory post-processor, when every configuration class's bean
     * definitions are registered (so the application's or test's own strategy is seen) and before any bean is made.
     */
    static void skipFlyway(ConfigurableListableBeanFactory beanFactory) {
        if (!(beanFactory instanceof BeanDefinitionRegistry registry)) {
            throw new IllegalStateException("pgfork: the test context's bean factory cannot take bean definitions; set "
                    + PgforkContextCustomizer.SKIP_APP_MIGRATIONS + "=false");
        }
        for (int i = 0; i < FLYWAY_STRATEGIES.length; i++) {
            Class<?> strategy = load(FLYWAY_STRATEGIES[i]);
            if (strategy != null && beanFactory.getBeanNamesForType(strategy, true, false).length == 0) {
                registry.registerBeanDefinition(FLYWAY_STRATEGY_BEAN + (i == 0 ? "" : i), noOpDefinition(strategy));
            }
        }
    }

    private static <T> RootBeanDefinition noOpDefinition(Class<T> strategy) {
        T noOp = strategy.cast(Proxy.newProxyInstance(strategy.getClassLoader(), new Class<?>[] {strategy},
                (proxy, method, args) -> switch (method.getName()) {
                    case "toString" -> "pgfork: the template is migrated with the application's Flyway locations; not migrating at context start";
                    case "hashCode" -> System.identityHashCode(proxy);
                    case "equals" -> proxy == args[0];
                    default -> null; // migrate(Flyway): nothing to do
                }));
        RootBeanDefinition def = new RootBeanDefinition(strategy, () -> noOp);
        def.setRole(BeanDefinition.ROLE_INFRASTRUCTURE);
        return def;
    }

    /** Makes every SpringLiquibase of the context skip its update (setShouldRun(false)) before it initializes. */
    static void skipLiquibase(ConfigurableListableBeanFactory beanFactory) {
        Class<?> springLiquibase = load(SPRING_LIQUIBASE);
        if (springLiquibase == null) {
            return;
        }
        Method setShouldRun;
        try {
            setShouldRun = springLiquibase.getMethod("setShouldRun", boolean.class);
        } catch (NoSuchMethodException e) {
            throw new IllegalStateException("pgfork: " + SPRING_LIQUIBASE + " has no setShouldRun(boolean); set "
                    + PgforkContextCustomizer.SKIP_APP_MIGRATIONS + "=false", e);
        }
        beanFactory.addBeanPostProcessor(new BeanPostProcessor() {
            @Override
            public Object postProcessBeforeInitialization(Object bean, String beanName) throws BeansException {
                if (springLiquibase.isInstance(bean)) {
                    try {
                        setShouldRun.invoke(bean, false);
                    } catch (IllegalAccessException | InvocationTargetException e) {
                        throw new IllegalStateException("pgfork: turning off " + beanName + "'s update: " + e, e);
                    }
                }
                return bean;
            }
        });
    }

    private static Class<?> load(String name) {
        try {
            return Class.forName(name, false, AppMigrations.class.getClassLoader());
        } catch (ClassNotFoundException | LinkageError e) {
            return null;
        }
    }
}
