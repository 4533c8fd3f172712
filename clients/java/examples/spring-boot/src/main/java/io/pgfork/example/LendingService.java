package io.pgfork.example;

import org.springframework.stereotype.Service;
import org.springframework.transaction.annotation.Transactional;

/** Lending and returning books. */
@Service
public class LendingService {
    private final BookRepository books;
    private final MemberRepository members;
    private final LoanRepository loans;

    /**
     * @param books the books
     * @param members the members
     * @param loans the loans
     */
    public LendingService(BookRepository books, MemberRepository members, LoanRepository loans) {
        this.books = books;
        this.members = members;
        this.loans = loans;
    }

    /**
     * Lends a copy of a book to a member.
     *
     * @param isbn the book's ISBN
     * @param email the member's email
     * @return the loan
     * @throws IllegalStateException when every copy is out
     */
    @Transactional
    public Loan lend(String isbn, String email) {
        Book book = books.findByIsbn(isbn).orElseThrow(() -> new IllegalArgumentException("no book " + isbn));
        Member member = members.findByEmail(email).orElseThrow(() -> new IllegalArgumentException("no member " + email));
        if (loans.countByBookAndReturnedFalse(book) >= book.getCopies()) {
            throw new IllegalStateException("every copy of " + isbn + " is out");
        }
        return loans.save(new Loan(book, member));
    }

    /**
     * Takes a book back.
     *
     * @param loanId the loan
     */
    @Transactional
    public void giveBack(long loanId) {
        loans.findById(loanId).orElseThrow(() -> new IllegalArgumentException("no loan " + loanId)).markReturned();
    }
}
