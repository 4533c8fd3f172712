CREATE TABLE users (
  id   serial PRIMARY KEY,
  name text NOT NULL UNIQUE
);
