package io.pgfork.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.springframework.core.env.MapPropertySource;
import org.springframework.core.env.StandardEnvironment;

/**
 * Which of the application's migrations a template is (they are then skipped at context start): only its own
 * Liquibase changelog here (Flyway is not on this module's test classpath), not another the annotation names.
 */
class TemplateTest {
    private static StandardEnvironment env(Map<String, Object> props) {
        StandardEnvironment env = new StandardEnvironment();
        env.getPropertySources().addFirst(new MapPropertySource("test", props));
        return env;
    }

    private static final Map<String, Object> APP = Map.of("spring.liquibase.change-log", AppLiquibaseTest.CHANGELOG);

    @Test
    void theApplicationsChangelog() {
        var t = new PgforkContextCustomizer(new String[0], "").template(env(APP));
        assertEquals(new PgforkContextCustomizer.Template(AppLiquibaseTest.CHANGELOG, null, true), t);
        assertEquals(false, t.appFlyway());
    }

    @Test
    void theAnnotationNamesTheSameChangelog() {
        var t = new PgforkContextCustomizer(new String[0], AppLiquibaseTest.CHANGELOG).template(env(APP));
        assertEquals(true, t.appLiquibase());
    }

    @Test
    void theAnnotationNamesAnotherChangelog() {
        var t = new PgforkContextCustomizer(new String[0], "classpath:db/changelog/other.yaml").template(env(APP));
        assertEquals(false, t.appLiquibase(), "the application's Liquibase runs as it would without pgfork");
    }

    @Test
    void neitherFlywayNorLiquibaseIsNotAnErrorUntilTheMigratorIsAskedFor() {
        var t = new PgforkContextCustomizer(new String[0], "").template(env(Map.of("spring.liquibase.enabled", "false")));
        assertEquals(new PgforkContextCustomizer.Template(null, List.of("classpath:db/migration"), false), t);
        assertEquals(false, t.appFlyway() || t.appLiquibase(), "no Flyway on this classpath: not the application's");
    }

    @Test
    void theApplicationsLiquibaseIsOff() {
        var t = new PgforkContextCustomizer(new String[0], AppLiquibaseTest.CHANGELOG)
                .template(env(Map.of("spring.liquibase.change-log", AppLiquibaseTest.CHANGELOG, "spring.liquibase.enabled", "false")));
        assertEquals(false, t.appLiquibase());
    }

    private static final Map<String, Object> SQL_INIT = Map.of("spring.liquibase.enabled", "false", "spring.sql.init.platform", "pgforktest");

    @Test
    void springsSqlInitScriptsAtBootsDefaultLocationsForThePlatform() {
        var t = new PgforkContextCustomizer(new String[0], "").template(env(SQL_INIT));
        assertEquals(true, t.appSqlInit());
        assertEquals(false, t.appFlyway() || t.appLiquibase());
        assertTrue(t.migrator().toString().contains("schema-pgforktest.sql"), t.migrator().toString());
        assertTrue(t.migrator().toString().indexOf("schema-") < t.migrator().toString().indexOf("data-"), "schema scripts first");
    }

    @Test
    void theSqlInitScriptsSettingsArePartOfTheTemplateHash() {
        var a = new PgforkContextCustomizer(new String[0], "").template(env(SQL_INIT)).migrator().templateHash();
        var props = new java.util.HashMap<String, Object>(SQL_INIT);
        props.put("spring.sql.init.separator", "@@");
        var b = new PgforkContextCustomizer(new String[0], "").template(env(props)).migrator().templateHash();
        assertNotEquals(a, b);
    }

    @Test
    void sqlInitModeNeverIsNotTheTemplate() {
        var props = new java.util.HashMap<String, Object>(SQL_INIT);
        props.put("spring.sql.init.mode", "never");
        assertEquals(false, new PgforkContextCustomizer(new String[0], "").template(env(props)).appSqlInit());
    }

    @Test
    void aMissingSqlInitScriptFailsAsSpringBootWould() {
        var props = new java.util.HashMap<String, Object>(SQL_INIT);
        props.put("spring.sql.init.schema-locations", "classpath:db/none/schema.sql");
        var e = assertThrows(IllegalStateException.class, () -> new PgforkContextCustomizer(new String[0], "").template(env(props)));
        assertTrue(e.getMessage().contains("classpath:db/none/schema.sql"), e.getMessage());
    }

    @Test
    void theApplicationsLiquibaseThenItsSqlInitScriptsWhenBootRunsBoth() {
        var props = new java.util.HashMap<String, Object>(APP);
        props.put("spring.sql.init.platform", "pgforktest");
        var alone = new PgforkContextCustomizer(new String[0], "").template(env(props));
        assertEquals(false, alone.appSqlInit(), "mode embedded (Boot's default) does not run the scripts on PostgreSQL");
        props.put("spring.sql.init.mode", "always");
        var both = new PgforkContextCustomizer(new String[0], "").template(env(props));
        assertEquals(true, both.appLiquibase() && both.appSqlInit(), "the template is the application's Liquibase and SQL init");
        String m = both.migrator().toString();
        assertTrue(m.indexOf("db/starts/changelog.yaml") >= 0 && m.indexOf("db/starts/changelog.yaml") < m.indexOf("schema-pgforktest.sql"),
                "Liquibase first, then the scripts, as Boot orders them: " + m);
        assertNotEquals(alone.migrator().templateHash(), both.migrator().templateHash(), "another template");
        props.put("spring.jpa.defer-datasource-initialization", "true");
        assertEquals(false, new PgforkContextCustomizer(new String[0], "").template(env(props)).appSqlInit(),
                "scripts deferred until Hibernate made its schema are not the template's");
    }
}
