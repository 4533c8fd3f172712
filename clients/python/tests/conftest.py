import contextlib

pytest_plugins = ["pytester"]

# The pytester fixture restores sys.modules when its test ends, so a module
# first imported inside such a test (SQLAlchemy, by an in-process Alembic
# template_hash) is imported a second time by a later test in the same
# worker, while SQLAlchemy's compiled extensions keep the first copy's
# classes ("'InternalTraversal' object is not callable"). Importing them
# here, before any test, puts them in every snapshot.
with contextlib.suppress(ImportError):
    import alembic.command  # noqa: F401
    import alembic.config  # noqa: F401
    import sqlalchemy  # noqa: F401
