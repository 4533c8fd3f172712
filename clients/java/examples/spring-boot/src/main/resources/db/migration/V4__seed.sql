INSERT INTO book (isbn, title, copies) VALUES
    ('978-0262033848', 'Introduction to Algorithms', 2),
    ('978-0131103627', 'The C Programming Language', 1);
INSERT INTO member (email, name) VALUES ('ada@example.org', 'Ada');
