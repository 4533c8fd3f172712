package io.pgfork.spring;

import java.util.List;
import org.springframework.core.annotation.AnnotatedElementUtils;
import org.springframework.test.context.ContextConfigurationAttributes;
import org.springframework.test.context.ContextCustomizer;
import org.springframework.test.context.ContextCustomizerFactory;

/**
 * Finds {@link AutoConfigurePgfork} on a test class (registered in META-INF/spring.factories). Test classes with
 * equal settings get equal customizers, so Spring's context cache shares their context.
 */
public final class PgforkContextCustomizerFactory implements ContextCustomizerFactory {
    @Override
    public ContextCustomizer createContextCustomizer(Class<?> testClass, List<ContextConfigurationAttributes> configAttributes) {
        AutoConfigurePgfork a = AnnotatedElementUtils.findMergedAnnotation(testClass, AutoConfigurePgfork.class);
        return a == null ? null : new PgforkContextCustomizer(a.flyway(), a.liquibase());
    }
}
