-- +goose Up
INSERT INTO accounts (owner) VALUES ('bob');

-- +goose Down
DELETE FROM accounts WHERE owner = 'bob';
