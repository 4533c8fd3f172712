INSERT INTO accounts (owner, cents) VALUES ('alice', 1000), ('bob', 500);
