package io.pgfork.example;

import jakarta.persistence.Entity;
import jakarta.persistence.GeneratedValue;
import jakarta.persistence.GenerationType;
import jakarta.persistence.Id;

/** A title the library holds some copies of. */
@Entity
public class Book {
    @Id
    @GeneratedValue(strategy = GenerationType.IDENTITY)
    private Long id;
    private String isbn;
    private String title;
    private int copies;

    protected Book() {
    }

    /**
     * A new book.
     *
     * @param isbn its ISBN
     * @param title its title
     * @param copies how many copies the library holds
     */
    public Book(String isbn, String title, int copies) {
        this.isbn = isbn;
        this.title = title;
        this.copies = copies;
    }

    /** @return the id */
    public Long getId() {
        return id;
    }

    /** @return the ISBN */
    public String getIsbn() {
        return isbn;
    }

    /** @return the title */
    public String getTitle() {
        return title;
    }

    /** @return the copies held */
    public int getCopies() {
        return copies;
    }
}
