"""seed accounts

Revision ID: 0003
Revises: 0002
"""
import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    accounts = sa.table("accounts", sa.column("owner", sa.Text), sa.column("cents", sa.BigInteger))
    op.bulk_insert(accounts, [{"owner": "alice", "cents": 1000}, {"owner": "bob", "cents": 500}])


def downgrade() -> None:
    op.execute("DELETE FROM accounts")
