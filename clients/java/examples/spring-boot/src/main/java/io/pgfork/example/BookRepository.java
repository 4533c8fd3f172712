package io.pgfork.example;

import java.util.Optional;
import org.springframework.data.jpa.repository.JpaRepository;

/** Books. */
public interface BookRepository extends JpaRepository<Book, Long> {
    /**
     * @param isbn an ISBN
     * @return the book with it
     */
    Optional<Book> findByIsbn(String isbn);
}
