ALTER TABLE users ADD COLUMN email text NOT NULL REFERENCES no_such_table (id);
