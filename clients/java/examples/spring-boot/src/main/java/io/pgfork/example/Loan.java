package io.pgfork.example;

import jakarta.persistence.Column;
import jakarta.persistence.Entity;
import jakarta.persistence.GeneratedValue;
import jakarta.persistence.GenerationType;
import jakarta.persistence.Id;
import jakarta.persistence.ManyToOne;

/** A book lent to a member. */
@Entity
public class Loan {
    @Id
    @GeneratedValue(strategy = GenerationType.IDENTITY)
    private Long id;
    @ManyToOne(optional = false)
    private Book book;
    @ManyToOne(optional = false)
    private Member member;
    @Column(nullable = false)
    private boolean returned;

    protected Loan() {
    }

    /**
     * A new open loan.
     *
     * @param book the book
     * @param member the member
     */
    public Loan(Book book, Member member) {
        this.book = book;
        this.member = member;
    }

    /** @return the id */
    public Long getId() {
        return id;
    }

    /** @return the book */
    public Book getBook() {
        return book;
    }

    /** @return the member */
    public Member getMember() {
        return member;
    }

    /** @return whether it was returned */
    public boolean isReturned() {
        return returned;
    }

    /** Marks the book returned. */
    public void markReturned() {
        returned = true;
    }
}
