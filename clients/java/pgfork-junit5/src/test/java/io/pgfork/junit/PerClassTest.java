package io.pgfork.junit;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.sql.Connection;
import java.sql.SQLException;
import java.sql.Statement;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;

@PgforkTest(scope = PgforkTest.Scope.CLASS)
@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
class PerClassTest {
    @BeforeAll
    static void seed(Connection c) throws SQLException {
        try (Statement st = c.createStatement()) {
            st.execute("INSERT INTO books (title) VALUES ('from BeforeAll')");
        }
    }

    @Test
    @Order(1)
    void first(Connection c) throws SQLException {
        try (Statement st = c.createStatement()) {
            assertEquals(2, PerMethodTest.count(st));
            st.execute("INSERT INTO books (title) VALUES ('first')");
        }
    }

    @Test
    @Order(2)
    void secondSeesTheFirstsWrite(Connection c) throws SQLException {
        try (Statement st = c.createStatement()) {
            assertEquals(3, PerMethodTest.count(st));
        }
    }
}
