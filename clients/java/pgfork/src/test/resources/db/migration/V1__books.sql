CREATE TABLE books (id bigserial PRIMARY KEY, title text NOT NULL);
