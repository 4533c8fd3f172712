"""The client against a real pgfork serve: IntegreSQL's flow and its errors."""

import os
import secrets
import threading
import time
from typing import Iterator

import psycopg
import pytest

import pgfork
from pgfork import Client


@pytest.fixture
def client(pgfork_client: Client) -> Client:
    return pgfork_client


@pytest.fixture
def hash(client: Client) -> Iterator[str]:
    h = secrets.token_hex(16)
    yield h
    try:
        client.discard_template(h)
    except pgfork.ApiError:
        pass


def count(url: str, sql: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(sql.encode()).fetchone()
        assert row is not None
        return int(row[0])


def test_protocol_flow(client: Client, hash: str) -> None:
    tpl = client.initialize_template(hash)
    assert tpl.template_hash == hash
    assert tpl.config.host and tpl.config.port and tpl.config.database
    with pytest.raises(pgfork.TemplateAlreadyInitialized) as exc:
        client.initialize_template(hash)
    assert exc.value.status == 423

    with psycopg.connect(tpl.config.conninfo, autocommit=True) as conn:
        conn.execute("CREATE TABLE marker (who text NOT NULL); INSERT INTO marker VALUES ('template')")
    client.finalize_template(hash)

    a = client.get_test_database(hash)
    b = client.get_test_database(hash)
    assert a.template_hash == b.template_hash == hash
    assert a.id != b.id and a.config.database != b.config.database != tpl.config.database
    with psycopg.connect(a.config.url, autocommit=True) as conn:
        conn.execute("INSERT INTO marker VALUES ('a')")
    assert count(b.config.url, "SELECT count(*) FROM marker") == 1

    client.recreate_test_database(hash, a.id)
    client.unlock_test_database(hash, b.id)
    for _ in range(3):
        d = client.get_test_database(hash)
        assert count(d.config.url, "SELECT count(*) FROM marker WHERE who <> 'template'") == 0
        client.return_test_database(hash, d.id)

    client.discard_template(hash)
    with pytest.raises((pgfork.TemplateDiscarded, pgfork.TemplateNotFound)):
        client.get_test_database(hash)


def test_errors(client: Client, hash: str) -> None:
    unknown = secrets.token_hex(16)
    with pytest.raises(pgfork.TemplateNotFound) as exc:
        client.get_test_database(unknown)
    assert exc.value.status == 404
    with pytest.raises(pgfork.TemplateNotFound):
        client.finalize_template(unknown)
    with pytest.raises(pgfork.TemplateNotFound):
        client.discard_template(unknown)
    with pytest.raises(pgfork.BadRequest):
        client.initialize_template("")

    client.initialize_template(hash)
    client.finalize_template(hash)
    with pytest.raises((pgfork.TestDatabaseNotFound, pgfork.TemplateNotFound)):
        client.unlock_test_database(hash, 987654)
    with pytest.raises(pgfork.ApiError) as exc:
        client.get_test_database("x'; DROP DATABASE postgres; --")
    assert exc.value.status in (400, 404)


def test_get_waits_for_finalize(client: Client, hash: str) -> None:
    client.initialize_template(hash)
    timer = threading.Timer(0.7, client.finalize_template, args=(hash,))
    start = time.monotonic()
    timer.start()
    try:
        db = client.get_test_database(hash)
    finally:
        timer.join()
    assert time.monotonic() - start >= 0.35
    client.recreate_test_database(hash, db.id)


def test_token_required(client: Client) -> None:
    token = os.environ.get("PGFORK_TOKEN")
    if not token:
        pytest.skip("PGFORK_TOKEN unset: the server was started without --token")
    for bad in (None, token + "x"):
        with pytest.raises(pgfork.Unauthorized) as exc:
            Client(client.base_url, token=bad).get_test_database(secrets.token_hex(16))
        assert exc.value.status == 401


def test_unreachable() -> None:
    c = Client("http://127.0.0.1:1/api/v1")
    assert c.base_url == "http://127.0.0.1:1"
    assert not c.reachable(timeout=1)
    with pytest.raises(pgfork.ServerUnreachable):
        c.initialize_template("x")
