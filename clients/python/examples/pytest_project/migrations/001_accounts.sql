CREATE TABLE accounts (
    id bigserial PRIMARY KEY,
    owner text NOT NULL,
    cents bigint NOT NULL CHECK (cents >= 0)
);
INSERT INTO accounts (owner, cents) VALUES ('alice', 100), ('bob', 50);
