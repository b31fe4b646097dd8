"""replica.file_identity: which file a POSIX copy is, recorded when the catalog reads it, so that a
delete removes that file and never one written at its path since

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06 05:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Null for every replica recorded before: the next scrub of each records it, and a delete
    # before that removes the file only if its bytes are the registered ones.
    op.add_column("replica", sa.Column("file_identity", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("replica", "file_identity")
