INSERT INTO posts (user_id, title) SELECT id, 'hello from ' || name FROM users;
