-- Test data Spring's SQL init adds after Flyway migrated the schema (spring.sql.init.mode=always).
INSERT INTO book (isbn, title, copies) VALUES ('978-1593279509', 'Eloquent JavaScript', 1);
