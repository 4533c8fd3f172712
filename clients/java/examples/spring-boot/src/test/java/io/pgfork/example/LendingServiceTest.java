package io.pgfork.example;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pgfork.spring.AutoConfigurePgfork;
import org.junit.jupiter.api.Test;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.boot.test.context.SpringBootTest;

// The whole application, its DataSource a fresh copy of the migrated template for every test method;
// no @Transactional rollback needed: each test's writes are committed and gone with its database.
@SpringBootTest
@AutoConfigurePgfork
class LendingServiceTest {
    @Autowired
    LendingService lending;
    @Autowired
    LoanRepository loans;
    @Autowired
    MemberRepository members;
    @Autowired
    BookRepository books;

    @Test
    void lendsACopy() {
        Loan loan = lending.lend("978-0131103627", "ada@example.org");
        assertThat(loan.getId()).isNotNull();
        assertThat(loans.count()).isEqualTo(1);
    }

    @Test
    void theOnlyCopyCannotGoOutTwice() {
        lending.lend("978-0131103627", "ada@example.org");
        assertThatThrownBy(() -> lending.lend("978-0131103627", "ada@example.org"))
                .isInstanceOf(IllegalStateException.class).hasMessageContaining("every copy");
    }

    @Test
    void aReturnedCopyGoesOutAgain() {
        Loan first = lending.lend("978-0131103627", "ada@example.org");
        lending.giveBack(first.getId());
        assertThat(lending.lend("978-0131103627", "ada@example.org").getId()).isNotEqualTo(first.getId());
    }

    @Test
    void theDatabaseLimitsOpenLoansToThree() {
        books.save(new Book("978-3", "Three", 5));
        for (int i = 0; i < 3; i++) {
            lending.lend("978-3", "ada@example.org");
        }
        assertThatThrownBy(() -> lending.lend("978-3", "ada@example.org"))
                .hasRootCauseMessage("ERROR: member 1 already holds three books\n  Where: PL/pgSQL function loan_limit() line 4 at RAISE");
    }

    @Test
    void noLoansLeakFromEarlierTests() {
        assertThat(loans.count()).isZero();
    }

    @Test
    void newMembers() {
        members.save(new Member("grace@example.org", "Grace"));
        lending.lend("978-0262033848", "grace@example.org");
        assertThat(members.count()).isEqualTo(2);
    }

    @Test
    void unknownBook() {
        assertThatThrownBy(() -> lending.lend("nope", "ada@example.org")).hasMessage("no book nope");
    }
}
