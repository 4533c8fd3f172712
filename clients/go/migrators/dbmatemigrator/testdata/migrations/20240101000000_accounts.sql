-- migrate:up
CREATE TABLE accounts (id serial PRIMARY KEY, owner text NOT NULL);
INSERT INTO accounts (owner) VALUES ('alice'), ('bob');

-- migrate:down
DROP TABLE accounts;
