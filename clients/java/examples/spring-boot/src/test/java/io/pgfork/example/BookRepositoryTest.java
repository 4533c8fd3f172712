package io.pgfork.example;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pgfork.spring.AutoConfigurePgfork;
import org.junit.jupiter.api.RepeatedTest;
import org.junit.jupiter.api.Test;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.boot.data.jpa.test.autoconfigure.DataJpaTest;
import org.springframework.dao.DataIntegrityViolationException;

@DataJpaTest
@AutoConfigurePgfork
class BookRepositoryTest {
    @Autowired
    BookRepository books;

    @Test
    void theMigrationsSeedTwoBooks() {
        assertThat(books.count()).isEqualTo(2);
        assertThat(books.findByIsbn("978-0131103627")).get().extracting(Book::getTitle)
                .isEqualTo("The C Programming Language");
    }

    @RepeatedTest(5)
    void eachTestSeesOnlyTheSeedAndItsOwnWrites() {
        assertThat(books.count()).isEqualTo(2);
        books.saveAndFlush(new Book("978-1-" + System.nanoTime(), "Fresh", 1));
        assertThat(books.count()).isEqualTo(3);
    }

    @Test
    void isbnsAreUnique() {
        assertThatThrownBy(() -> books.saveAndFlush(new Book("978-0262033848", "Duplicate", 1)))
                .isInstanceOf(DataIntegrityViolationException.class);
    }

    @Test
    void negativeCopiesAreRefusedByTheSchema() {
        assertThatThrownBy(() -> books.saveAndFlush(new Book("978-2", "Negative", -1)))
                .isInstanceOf(DataIntegrityViolationException.class);
    }

    @Test
    void deletingIsIsolatedToo() {
        books.deleteAllInBatch();
        assertThat(books.count()).isZero();
    }
}
