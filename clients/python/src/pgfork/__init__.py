"""Client and pytest plugin for pgfork serve, the IntegreSQL-compatible test-database server."""

from .client import (
    DEFAULT_URL,
    ApiError,
    BadRequest,
    Client,
    DatabaseConfig,
    PgforkError,
    PoolFull,
    ServerUnreachable,
    ServiceUnavailable,
    TemplateAlreadyInitialized,
    TemplateDatabase,
    TemplateDiscarded,
    TemplateNotFound,
    TestDatabase,
    TestDatabaseInUse,
    TestDatabaseNotFound,
    Unauthorized,
    mask_base_url,
)
from .binary import BinaryNotFound, find_binary, require_binary
from .hashing import template_hash
from .migrate import Migrator, SQLFiles, run_sql_files

__all__ = [
    "DEFAULT_URL",
    "ApiError",
    "BadRequest",
    "BinaryNotFound",
    "Client",
    "DatabaseConfig",
    "Migrator",
    "PgforkError",
    "PoolFull",
    "SQLFiles",
    "ServerUnreachable",
    "ServiceUnavailable",
    "TemplateAlreadyInitialized",
    "TemplateDatabase",
    "TemplateDiscarded",
    "TemplateNotFound",
    "TestDatabase",
    "TestDatabaseInUse",
    "TestDatabaseNotFound",
    "Unauthorized",
    "find_binary",
    "mask_base_url",
    "require_binary",
    "run_sql_files",
    "template_hash",
]
