"""Alembic's environment for pgfork's test project: the env.py `alembic init`
writes, reading the URL from the config's sqlalchemy.url (pgfork sets it)."""

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import engine_from_config, pool

config = context.config

if config.config_file_name is not None:
    fileConfig(config.config_file_name)

target_metadata = None

# For the tests only: count the runs of this file (pgfork must run it once per template).
if os.environ.get("PGFORK_TEST_ALEMBIC_RUNS"):
    with open(os.environ["PGFORK_TEST_ALEMBIC_RUNS"], "a", encoding="utf-8") as f:
        f.write("upgrade\n")


def run_migrations_offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata,
                      literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = engine_from_config(config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.",
                                     poolclass=pool.NullPool)
    with connectable.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
