CREATE TABLE colours (name text PRIMARY KEY);
INSERT INTO colours VALUES ('blue'), ('red');
