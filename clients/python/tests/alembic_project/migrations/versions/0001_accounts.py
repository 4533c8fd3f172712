"""create accounts

Revision ID: 0001
Revises:
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "accounts",
        sa.Column("owner", sa.Text, primary_key=True),
        sa.Column("cents", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("accounts")
