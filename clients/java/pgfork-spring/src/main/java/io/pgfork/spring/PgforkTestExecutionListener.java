package io.pgfork.spring;

import org.springframework.context.ApplicationContext;
import org.springframework.core.annotation.AnnotatedElementUtils;
import org.springframework.test.context.TestContext;
import org.springframework.test.context.support.AbstractTestExecutionListener;

/**
 * Swaps the database behind a pgfork test context's DataSource after each test method or class, as
 * {@link AutoConfigurePgfork#refresh()} says (registered in META-INF/spring.factories). It runs after Spring's
 * transactional listener has rolled back the test's transaction, and keeps a failing test's database. When a class
 * ends, its context gives back every copy it holds ({@link PgforkDataSource#park}) while it waits in Spring's context
 * cache.
 */
public final class PgforkTestExecutionListener extends AbstractTestExecutionListener {
    /** Before TransactionalTestExecutionListener (4000): its after-method callback runs before ours. */
    @Override
    public int getOrder() {
        return 3900;
    }

    @Override
    public void afterTestMethod(TestContext tc) {
        AutoConfigurePgfork a = annotation(tc);
        PgforkDataSource ds = dataSource(tc, a);
        if (ds == null) {
            return;
        }
        if (tc.getTestException() != null) {
            ds.markFailed();
        }
        if (a.refresh() == AutoConfigurePgfork.Refresh.AFTER_EACH_TEST_METHOD) {
            ds.refresh(tc.getTestClass().getSimpleName() + "." + tc.getTestMethod().getName());
        }
    }

    @Override
    public void afterTestClass(TestContext tc) {
        AutoConfigurePgfork a = annotation(tc);
        PgforkDataSource ds = dataSource(tc, a);
        if (ds == null) {
            return;
        }
        if (a.refresh() == AutoConfigurePgfork.Refresh.AFTER_CLASS) {
            ds.refresh(tc.getTestClass().getSimpleName());
        }
        if (a.refresh() != AutoConfigurePgfork.Refresh.NEVER) {
            ds.park(); // the context waits in Spring's cache holding no copy; the next class takes a fresh one
        }
    }

    private static AutoConfigurePgfork annotation(TestContext tc) {
        return AnnotatedElementUtils.findMergedAnnotation(tc.getTestClass(), AutoConfigurePgfork.class);
    }

    private static PgforkDataSource dataSource(TestContext tc, AutoConfigurePgfork a) {
        if (a == null || !tc.hasApplicationContext()) {
            return null;
        }
        ApplicationContext ctx = tc.getApplicationContext();
        return ctx.containsBean(PgforkContextCustomizer.BEAN) ? ctx.getBean(PgforkContextCustomizer.BEAN, PgforkDataSource.class) : null;
    }
}
