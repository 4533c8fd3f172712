package io.pgfork.example;

import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;

/** A small library: books, members, loans. */
@SpringBootApplication
public class LibraryApplication {
    /**
     * Runs the application.
     *
     * @param args command-line arguments
     */
    public static void main(String[] args) {
        SpringApplication.run(LibraryApplication.class, args);
    }
}
