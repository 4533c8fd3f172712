CREATE TABLE accounts (
    id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner text NOT NULL UNIQUE,
    cents bigint NOT NULL CHECK (cents >= 0)
);
CREATE TABLE notes (owner text NOT NULL, body text NOT NULL);
