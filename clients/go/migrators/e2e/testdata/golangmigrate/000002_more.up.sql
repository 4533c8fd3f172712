INSERT INTO accounts (owner) VALUES ('bob');
