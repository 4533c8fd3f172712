"""Each test gets its own database, migrated from migrations/ once per template."""


def test_insert(pgfork_db):
    pgfork_db.conn.execute("INSERT INTO accounts (owner, cents) VALUES ('carol', 1)")
    assert pgfork_db.conn.execute("SELECT count(*) FROM accounts").fetchone() == (3,)


def test_sees_only_the_migrations(pgfork_db):
    assert pgfork_db.conn.execute("SELECT count(*) FROM accounts").fetchone() == (2,)
