"""HTTP client for pgfork serve's native /api/v2, or IntegreSQL's /api/v1.

On v2 (the default) errors say more than IntegreSQL's: TemplateDiscarded
(410) after a discard, ServiceUnavailable (503) with the reason when no
database was ready in time, PoolFull (507) for a full disk; and every
hand-out has an unguessable ``token`` that :meth:`Client.unlock` and
:meth:`Client.recreate` use, so only its holder gives it back, once. Use
``api_version=1`` or a base URL ending in /api/v1 for IntegreSQL itself.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple, Type

DEFAULT_URL = "http://127.0.0.1:5000"


def mask_base_url(url: str) -> str:
    """url as errors and reprs show a base URL: what can carry a secret
    replaced by ``***`` — a userinfo (``user:password@``), the path (pgfork
    serve takes its token as the first path segment: ``http://host:5000/TOKEN``),
    a query and a fragment. Scheme, host and port stay, to say where."""
    try:
        u = urllib.parse.urlsplit(url)
        netloc = u.netloc
    except ValueError:
        return "***"
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    path = "/***" if u.path.strip("/") else ""
    return urllib.parse.urlunsplit((u.scheme, netloc, path, "***" if u.query else "", "***" if u.fragment else ""))


class PgforkError(Exception):
    """Base of every error this client raises."""


class ServerUnreachable(PgforkError):
    """No HTTP answer at all: nothing listens at the URL, or the connection broke."""


class ApiError(PgforkError):
    """The server answered with an unexpected status code."""

    def __init__(self, op: str, status: int, message: str) -> None:
        self.op = op
        self.status = status
        self.message = message
        super().__init__(f"{op}: {status} {message}".rstrip())


class BadRequest(ApiError):
    """400: the server refused the hash, id or body."""


class Unauthorized(ApiError):
    """401/403: missing or wrong Bearer token."""


class TemplateNotFound(ApiError):
    """404: no template with this hash."""


class TestDatabaseNotFound(ApiError):
    """404 from a test-database call: no test database with this id."""

    __test__ = False  # not a pytest test class


class TemplateDiscarded(ApiError):
    """410 (v2): the template was discarded (its setup failed). v1 answers 404."""


class TemplateAlreadyInitialized(ApiError):
    """423 from initialize_template: another caller builds (or built) this template."""


class TestDatabaseInUse(ApiError):
    """423 from a test-database call."""

    __test__ = False


class ServiceUnavailable(ApiError):
    """503: the server is shutting down or cannot reach PostgreSQL, or (v2) a
    wait for finalize or a ready database timed out or the pool is full; the
    message says which. v1 answers 500 for those, as IntegreSQL."""


class PoolFull(ApiError):
    """507 (v2): insufficient storage, the server's disk is full."""


_TEST_OPS = {"unlock", "recreate", "keep", "unlock_test_database", "recreate_test_database", "return_test_database"}


def _error_class(op: str, status: int, message: str) -> Type[ApiError]:
    if status == 400:
        return BadRequest
    if status in (401, 403):
        return Unauthorized
    if status == 404:
        # "template not found" names the template; anything else from a test
        # operation (v2: "no test database … under this id") the hand-out.
        if op in _TEST_OPS and "template not found" not in message.lower():
            return TestDatabaseNotFound
        return TemplateNotFound
    if status == 410:
        return TemplateDiscarded
    if status == 423:
        return TestDatabaseInUse if op in _TEST_OPS else TemplateAlreadyInitialized
    if status == 503:
        return ServiceUnavailable
    if status == 507:
        return PoolFull
    return ApiError


def _quote(value: str) -> str:
    if value and not any(c in value for c in " \t\n\r\v\f'\\"):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass(frozen=True)
class DatabaseConfig:
    """How to connect to one database, as the server sends it."""

    host: str
    port: int
    username: str
    password: str = field(repr=False)  # never in a repr (tracebacks, assertion messages)
    database: str
    additional_params: Dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "DatabaseConfig":
        return cls(
            host=str(d.get("host", "")),
            port=int(d.get("port", 0)),
            username=str(d.get("username", "")),
            password=str(d.get("password", "")),
            database=str(d.get("database", "")),
            additional_params={str(k): str(v) for k, v in (d.get("additionalParams") or {}).items()},
        )

    def _params(self) -> Dict[str, str]:
        p = dict(self.additional_params)
        p.setdefault("sslmode", "disable")
        return p

    @property
    def url(self) -> str:
        """A postgres:// URL (sslmode=disable unless additional_params says otherwise)."""
        q = self._params()
        user = urllib.parse.quote(self.username, safe="")
        if self.password:
            user += ":" + urllib.parse.quote(self.password, safe="")
        if self.host.startswith("/"):
            hostport = ""
            q["host"] = self.host
            if self.port:
                q["port"] = str(self.port)
        else:
            host = f"[{self.host}]" if ":" in self.host else self.host
            hostport = f"{host}:{self.port}" if self.port else host
        auth = user + "@" if user else ""
        query = urllib.parse.urlencode(sorted(q.items()))
        return f"postgres://{auth}{hostport}/{urllib.parse.quote(self.database, safe='')}?{query}"

    @property
    def conninfo(self) -> str:
        """A libpq keyword/value connection string, as the Go client's ConnectionString."""
        parts = [("host", self.host), ("port", str(self.port)), ("user", self.username)]
        if self.password:
            parts.append(("password", self.password))
        parts.append(("dbname", self.database))
        parts += sorted(self._params().items())
        return " ".join(f"{k}={_quote(v)}" for k, v in parts)


@dataclass(frozen=True)
class TemplateDatabase:
    """Answer to initialize_template: the empty template database to migrate."""

    template_hash: str
    config: DatabaseConfig


@dataclass(frozen=True)
class TestDatabase:
    """A test database handed out by get_test_database: ``id`` is the small
    number in its name; ``token`` the v2 hand-out id (None on v1). ``kept``
    counts the template's databases kept for inspection (keep) and
    ``warning``, when set, is a line for the test output saying they pile up
    (pgfork serve only)."""

    __test__ = False

    template_hash: str
    id: int
    config: DatabaseConfig
    token: Optional[str] = None
    kept: int = 0
    warning: Optional[str] = None


def _database(body: Mapping[str, Any], hash: str) -> Tuple[str, DatabaseConfig]:
    db = body.get("database") or {}
    h = body.get("templateHash") or db.get("templateHash") or hash
    return str(h), DatabaseConfig.from_json(db.get("config") or {})


class Client:
    """Client for the v2 API, or v1 with ``api_version=1`` or a base URL
    ending in /api/v1 (for IntegreSQL). base_url may end in /api (IntegreSQL
    style) or /api/v2.

    timeout bounds each request in seconds; get_test_database may wait server
    side for a template to be finalized, so keep it generous.
    """

    def __init__(self, base_url: str = DEFAULT_URL, token: Optional[str] = None, timeout: float = 120.0,
                 api_version: Optional[int] = None) -> None:
        u = urllib.parse.urlsplit(base_url or DEFAULT_URL)
        if u.scheme not in ("http", "https") or not u.netloc:
            raise ValueError(f"pgfork: base URL {mask_base_url(base_url or '')!r} must be http(s)://host[:port]")
        if api_version not in (None, 1, 2):
            raise ValueError(f"pgfork: api_version={api_version!r}: want 1 (IntegreSQL's API) or 2 (pgfork's)")
        path = u.path.rstrip("/")
        if api_version is None:
            api_version = 1 if path.endswith("/api/v1") else 2
        for suffix in ("/v1", "/v2", "/api"):
            if path.endswith(suffix):
                path = path[: -len(suffix)]
        self.base_url = urllib.parse.urlunsplit((u.scheme, u.netloc, path, "", ""))
        self.api_version: int = api_version
        self._api = f"/api/v{api_version}"
        self.token = token or None
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"pgfork.Client({self.masked_base_url!r})"

    def _mask(self, text: str) -> str:
        """text with the base URL, and its userinfo and path wherever they appear, masked."""
        text = text.replace(self.base_url, self.masked_base_url)
        u = urllib.parse.urlsplit(self.base_url)
        if "@" in u.netloc:
            text = text.replace(u.netloc.rsplit("@", 1)[0] + "@", "***@")
        if u.path.strip("/"):
            text = text.replace(u.path, "/***")
        return text

    @property
    def masked_base_url(self) -> str:
        """base_url as errors show it: a token or password in it replaced by ``***`` (mask_base_url)."""
        return mask_base_url(self.base_url)

    def _request(self, op: str, method: str, path: str, body: Optional[Mapping[str, Any]] = None,
                 want: int = 200, timeout: Optional[float] = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        except (urllib.error.URLError, OSError) as e:
            why = self._mask(str(e))
            where = self.masked_base_url
            raise ServerUnreachable(f"{op}: no answer from {where} (is `pgfork serve` running?): {why}") from e
        if status != want:
            message = raw.decode("utf-8", "replace").strip()
            try:
                parsed = json.loads(message)
                if isinstance(parsed, dict):
                    message = str(parsed.get("message") or parsed.get("error") or message)
            except ValueError:
                pass
            raise _error_class(op, status, message)(op, status, message[:300])
        return json.loads(raw) if raw.strip() else None

    @staticmethod
    def _h(hash: str) -> str:
        return urllib.parse.quote(hash, safe="")

    def healthy(self, timeout: float = 2.0) -> bool:
        """True if GET /healthz answers 200."""
        try:
            self._request("healthy", "GET", "/healthz", timeout=timeout)
            return True
        except PgforkError:
            return False

    def reachable(self, timeout: float = 2.0) -> bool:
        """True if anything answers HTTP at the base URL (IntegreSQL has no /healthz)."""
        try:
            self._request("reachable", "GET", "/healthz", timeout=timeout)
        except ServerUnreachable:
            return False
        except ApiError:
            pass
        return True

    def initialize_template(self, hash: str) -> TemplateDatabase:
        """Register a template; raises TemplateAlreadyInitialized if another caller did."""
        body = self._request("initialize_template", "POST", f"{self._api}/templates", {"hash": hash})
        h, cfg = _database(body, hash)
        return TemplateDatabase(h, cfg)

    def finalize_template(self, hash: str) -> None:
        """Mark the template ready: test databases are cloned from it."""
        self._request("finalize_template", "PUT", f"{self._api}/templates/{self._h(hash)}", want=204)

    def discard_template(self, hash: str) -> None:
        """Drop the template; waiters get TemplateDiscarded (TemplateNotFound on v1)."""
        self._request("discard_template", "DELETE", f"{self._api}/templates/{self._h(hash)}", want=204)

    def get_test_database(self, hash: str) -> TestDatabase:
        """A fresh test database; waits (server side) for finalize and a ready
        database. On v2: TemplateDiscarded if the template was discarded,
        ServiceUnavailable (with the reason) if none was ready in time."""
        body = self._request("get_test_database", "GET", f"{self._api}/templates/{self._h(hash)}/tests")
        h, cfg = _database(body, hash)
        kept, warning = int(body.get("kept") or 0), body.get("warning") or None
        if isinstance(body.get("id"), str):  # v2: the hand-out token, with the small id as number
            return TestDatabase(h, int(body["number"]), cfg, token=body["id"], kept=kept, warning=warning)
        return TestDatabase(h, int(body["id"]), cfg, kept=kept, warning=warning)

    def unlock(self, db: TestDatabase) -> None:
        """Give db back unchanged (only after a test that did not write). On
        v2 by its token: a hand-out given back already is TestDatabaseNotFound.
        On v1 (no token) it is unlock_test_database(db.id)."""
        self._hand_out_op("unlock", db)

    def recreate(self, db: TestDatabase) -> None:
        """Give db back to be recreated from the template; by its token as unlock."""
        self._hand_out_op("recreate", db)

    def keep(self, db: TestDatabase) -> None:
        """Keep db as it is for inspection (its test failed): pgfork serve no
        longer counts it against the pool's maximum, keeps it across a
        restart and drops the oldest kept beyond its --kept-max; giving it
        back later (recreate, unlock) drops it. By its token as unlock.
        IntegreSQL has no such call (an ApiError)."""
        self._hand_out_op("keep", db)

    def _hand_out_op(self, op: str, db: TestDatabase) -> None:
        if self.api_version == 1 or not db.token:
            self._request(op, "POST", f"/api/v1/templates/{self._h(db.template_hash)}/tests/{int(db.id)}/{op}", want=204)
            return
        token = urllib.parse.quote(db.token, safe="")
        self._request(op, "POST", f"/api/v2/templates/{self._h(db.template_hash)}/tests/{token}/{op}", want=204)

    def list_templates(self) -> Dict[str, Any]:
        """GET /api/v2/templates: ``{"databases": n, "templates": [{"templateHash",
        "state", "databases": {state: count}, "waiters", "total", "max"}]}``
        (pgfork serve's v2 only)."""
        if self.api_version == 1:
            raise PgforkError("list_templates: needs the v2 API (pgfork serve); this client talks v1")
        return dict(self._request("list_templates", "GET", "/api/v2/templates") or {})

    # By the small id, always on the v1 routes (v2 takes only tokens), with
    # IntegreSQL's semantics: an id never handed out is a 500, and a late call
    # after the server reclaimed the database gives back its next holder's.

    def unlock_test_database(self, hash: str, id: int) -> None:
        """Return test database id unchanged (v1 route; prefer unlock(db))."""
        self._request("unlock_test_database", "POST",
                      f"/api/v1/templates/{self._h(hash)}/tests/{int(id)}/unlock", want=204)

    def recreate_test_database(self, hash: str, id: int) -> None:
        """Return test database id to be recreated (v1 route; prefer recreate(db))."""
        self._request("recreate_test_database", "POST",
                      f"/api/v1/templates/{self._h(hash)}/tests/{int(id)}/recreate", want=204)

    def return_test_database(self, hash: str, id: int) -> None:
        """Deprecated DELETE …/tests/{id}, an alias of unlock kept for IntegreSQL."""
        self._request("return_test_database", "DELETE",
                      f"/api/v1/templates/{self._h(hash)}/tests/{int(id)}", want=204)

    def reset_all_tracking(self) -> None:
        """Forget every template and test database on the server."""
        self._request("reset_all_tracking", "DELETE", f"{self._api}/admin/templates", want=204)
