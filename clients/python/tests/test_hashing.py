from pathlib import Path

import pytest

from pgfork import DatabaseConfig, template_hash


def write(root: Path, rel: str, data: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(data)


def test_vector_matches_go_client(tmp_path: Path) -> None:
    # The same tree and value as TestTemplateHashVector in clients/go/client.
    write(tmp_path, "001_init.sql", "CREATE TABLE t (id int);\n")
    write(tmp_path, "002_seed.sql", "INSERT INTO t VALUES (1);\n")
    write(tmp_path, "sub/x.txt", "x")
    write(tmp_path, ".hidden", "ignored")
    write(tmp_path, ".git/HEAD", "ignored")
    assert template_hash(tmp_path, "v1") == "932859cbf397b84d815ddae7c844e733"


def test_hash_changes(tmp_path: Path) -> None:
    write(tmp_path, "a.sql", "1")
    base = template_hash(tmp_path, "k")
    assert template_hash(tmp_path, "k") == base
    assert template_hash(tmp_path, "other") != base
    write(tmp_path, ".swp", "editor junk")
    assert template_hash(tmp_path, "k") == base
    write(tmp_path, "a.sql", "2")
    changed = template_hash(tmp_path, "k")
    assert changed != base
    (tmp_path / "a.sql").rename(tmp_path / "b.sql")
    assert template_hash(tmp_path, "k") not in (base, changed)
    assert template_hash(None, "") != base
    with pytest.raises(FileNotFoundError):
        template_hash(tmp_path / "missing")


def test_symlinked_root(tmp_path: Path) -> None:
    # A MigrationsDir that is a symlink hashes like its target; the Go client's
    # TestTemplateHashSameAsPython compares both clients on such a tree.
    real = tmp_path / "real"
    write(real, "001.sql", "SELECT 1;\n")
    write(real, "nested/002.sql", "SELECT 2;\n")
    (real / "dangling.sql").symlink_to(tmp_path / "nowhere")
    link = tmp_path / "link"
    link.symlink_to(real)
    assert template_hash(link, "k") == template_hash(real, "k")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert template_hash(link, "k") != template_hash(empty, "k")


def test_connection_strings() -> None:
    c = DatabaseConfig("127.0.0.1", 5433, "u", "p w'\\", "db")
    assert c.conninfo == r"host=127.0.0.1 port=5433 user=u password='p w\'\\' dbname=db sslmode=disable"
    c = DatabaseConfig("localhost", 5432, "u", "p@ss/:", "d")
    assert c.url == "postgres://u:p%40ss%2F%3A@localhost:5432/d?sslmode=disable"
    c = DatabaseConfig("/run/pg", 5432, "u", "", "d", {"sslmode": "prefer"})
    assert c.url == "postgres://u@/d?host=%2Frun%2Fpg&port=5432&sslmode=prefer"


def test_works_without_psycopg() -> None:
    """psycopg is an extra (pgfork[psycopg]): without it the package, the
    client and the pytest plugin import, and a connection says what to install."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['psycopg'] = None\n"  # import psycopg now raises ImportError
        "import pgfork, pgfork.pytest_plugin\n"
        "try:\n"
        "    pgfork.run_sql_files('postgres://x@127.0.0.1:1/x', '.')\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install 'pgfork[psycopg]'" in out


def test_config_repr_hides_password() -> None:
    c = DatabaseConfig("h", 1, "u", "s3cret", "d")
    assert "s3cret" not in repr(c)
