"""The client against a real pgfork serve: the flow and its errors on v2, and IntegreSQL's answers on v1."""

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
    assert a.token and b.token and a.token != b.token, "v2 hand-outs carry distinct tokens"
    with psycopg.connect(a.config.url, autocommit=True) as conn:
        conn.execute("INSERT INTO marker VALUES ('a')")
    assert count(b.config.url, "SELECT count(*) FROM marker") == 1

    client.recreate(a)
    client.unlock(b)
    # A hand-out goes back once: its token is spent.
    with pytest.raises(pgfork.TestDatabaseNotFound) as exc:
        client.unlock(b)
    assert exc.value.status == 404
    with pytest.raises(pgfork.TestDatabaseNotFound):
        client.recreate(a)
    # By small id (the v1 routes), a v2 hand-out goes back too.
    for give_back in (client.unlock_test_database, client.recreate_test_database, client.return_test_database):
        d = client.get_test_database(hash)
        assert count(d.config.url, "SELECT count(*) FROM marker WHERE who <> 'template'") == 0
        give_back(hash, d.id)

    client.discard_template(hash)
    with pytest.raises(pgfork.TemplateDiscarded) as exc:
        client.get_test_database(hash)
    assert exc.value.status == 410


def test_api_v1(client: Client, hash: str) -> None:
    """A client on the v1 API gets IntegreSQL's answers from the same server."""
    v1 = Client(client.base_url + "/api/v1", token=client.token)
    assert v1.api_version == 1 and v1.base_url == client.base_url
    v1.initialize_template(hash)
    v1.finalize_template(hash)
    db = v1.get_test_database(hash)
    assert db.token is None
    assert count(db.config.url, "SELECT 1") == 1
    v1.recreate(db)
    with pytest.raises(pgfork.PgforkError):
        v1.list_templates()
    v1.discard_template(hash)
    with pytest.raises(pgfork.TemplateNotFound) as exc:
        v1.get_test_database(hash)
    assert exc.value.status == 404


def test_list_templates(client: Client, hash: str) -> None:
    client.initialize_template(hash)
    client.finalize_template(hash)
    db = client.get_test_database(hash)
    listed = {t["templateHash"]: t for t in client.list_templates()["templates"]}
    assert listed[hash]["state"] == "finalized"
    assert listed[hash]["databases"].get("in_use") == 1
    client.recreate(db)


def test_timeout_is_service_unavailable(client: Client, hash: str) -> None:
    """On v2 a template nobody finalizes gets 503 with the reason after the
    server's finalize timeout (clients/test.sh starts it with 15s)."""
    client.initialize_template(hash)
    with pytest.raises(pgfork.ServiceUnavailable) as exc:
        client.get_test_database(hash)
    assert exc.value.status == 503
    assert "finalized" in exc.value.message


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
    with pytest.raises(pgfork.TestDatabaseNotFound) as exc:
        client.unlock(pgfork.TestDatabase(hash, 1, pgfork.DatabaseConfig("", 0, "", "", ""), token="0" * 32))
    assert exc.value.status == 404
    with pytest.raises(pgfork.ApiError) as exc:  # by small id: IntegreSQL's 500 "invalid database index"
        client.unlock_test_database(hash, 987654)
    assert exc.value.status == 500
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
    client.recreate(db)


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
    assert c.base_url == "http://127.0.0.1:1" and c.api_version == 1
    for url, version in (("http://h:5000", 2), ("http://h:5000/api", 2), ("http://h:5000/api/v2/", 2),
                         ("http://h:5000/p/api/v1", 1)):
        assert Client(url).api_version == version, url
    assert Client("http://h:5000", api_version=1).api_version == 1
    with pytest.raises(ValueError):
        Client("http://h:5000", api_version=3)
    assert not c.reachable(timeout=1)
    with pytest.raises(pgfork.ServerUnreachable):
        c.initialize_template("x")


def test_secrets_in_the_base_url_are_masked() -> None:
    """A token in the base URL's path (pgfork serve takes http://HOST:PORT/TOKEN/api) or a userinfo is
    never shown by repr or an error, as passwords are not; where the server is still is. No server needed."""
    secret = "s3cr3t" + secrets.token_hex(8)
    for url in (f"http://127.0.0.1:1/{secret}/api", f"http://127.0.0.1:1/{secret}",
                f"http://u:{secret}@127.0.0.1:1/api/v2", f"http://{secret}@127.0.0.1:1"):
        c = Client(url, timeout=2)
        assert secret not in repr(c) and "127.0.0.1:1" in repr(c), repr(c)
        with pytest.raises(pgfork.ServerUnreachable) as exc:
            c.initialize_template("x")
        assert secret not in str(exc.value) and "127.0.0.1:1" in str(exc.value), str(exc.value)
    with pytest.raises(ValueError) as bad:
        Client(f"ftp://h/{secret}")
    assert secret not in str(bad.value)
    assert pgfork.mask_base_url(f"http://h:5000/{secret}") == "http://h:5000/***"
    assert pgfork.mask_base_url(f"https://u:{secret}@h/x?token={secret}") == "https://***@h/***?***"
    assert pgfork.mask_base_url("http://h:5000") == "http://h:5000"
