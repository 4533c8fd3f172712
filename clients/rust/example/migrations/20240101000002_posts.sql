CREATE TABLE posts (
    id bigserial PRIMARY KEY,
    user_id bigint NOT NULL REFERENCES users (id),
    title text NOT NULL
);
CREATE INDEX posts_user_id ON posts (user_id);
