package io.pgfork.example;

import org.springframework.data.jpa.repository.JpaRepository;

/** Loans. */
public interface LoanRepository extends JpaRepository<Loan, Long> {
    /**
     * @param book a book
     * @return its open loans
     */
    long countByBookAndReturnedFalse(Book book);
}
