package io.pgfork.example;

import static org.assertj.core.api.Assertions.assertThat;

import io.pgfork.spring.AutoConfigurePgfork;
import org.junit.jupiter.api.Nested;
import org.junit.jupiter.api.RepeatedTest;
import org.junit.jupiter.api.Test;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.boot.test.autoconfigure.jdbc.JdbcTest;
import org.springframework.boot.test.autoconfigure.orm.jpa.DataJpaTest;
import org.springframework.boot.test.context.SpringBootTest;
import org.springframework.jdbc.core.JdbcTemplate;

/** pgfork-spring on Spring Boot 3.5: the whole application and both test slices. */
class Boot3SlicesTest {
    @Nested
    @SpringBootTest
    @AutoConfigurePgfork
    class WholeApplication {
        @Autowired
        LendingService lending;
        @Autowired
        LoanRepository loans;

        @RepeatedTest(3)
        void eachTestStartsWithNoLoans() {
            assertThat(loans.count()).isZero();
            lending.lend("978-0262033848", "ada@example.org");
            assertThat(loans.count()).isEqualTo(1);
        }
    }

    @Nested
    @DataJpaTest
    @AutoConfigurePgfork
    class Jpa {
        @Autowired
        BookRepository books;

        @Test
        void seeded() {
            assertThat(books.count()).isEqualTo(2);
        }
    }

    @Nested
    @JdbcTest
    @AutoConfigurePgfork
    class Jdbc {
        @Autowired
        JdbcTemplate jdbc;

        @Test
        void migratedByFlyway() {
            assertThat(jdbc.queryForObject("SELECT max(version) FROM flyway_schema_history", String.class)).isEqualTo("5");
        }
    }
}
