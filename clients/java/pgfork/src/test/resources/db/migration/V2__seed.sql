INSERT INTO books (title) VALUES ('The Seed');
