package io.pgfork.example;

import static org.assertj.core.api.Assertions.assertThat;

import io.pgfork.spring.AutoConfigurePgfork;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.boot.test.context.SpringBootTest;

// One database for the class's tests, fresh for the next class: a scenario in steps.
@SpringBootTest
@AutoConfigurePgfork(refresh = AutoConfigurePgfork.Refresh.AFTER_CLASS)
@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
class SharedPerClassTest {
    @Autowired
    LendingService lending;
    @Autowired
    LoanRepository loans;

    @Test
    @Order(1)
    void lend() {
        lending.lend("978-0262033848", "ada@example.org");
        assertThat(loans.count()).isEqualTo(1);
    }

    @Test
    @Order(2)
    void theLoanIsStillThere() {
        assertThat(loans.count()).isEqualTo(1);
        lending.lend("978-0262033848", "ada@example.org");
    }

    @Test
    @Order(3)
    void bothCopiesAreOut() {
        assertThat(loans.count()).isEqualTo(2);
    }
}
