"""Initial schema: the tuned_configs table.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_KEY = (
    "kernel",
    "kernel_hash",
    "backend",
    "arch",
    "device_name",
    "cu_count",
    "warp_size",
    "triton_version",
    "spec_len",
    "batch",
    "vocab",
    "dtype",
    "draft_probs",
)


def upgrade() -> None:
    # Literal column definitions, not the current model: a migration must keep
    # producing the schema of its own revision when the model moves on.
    op.create_table(
        "tuned_configs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("kernel", sa.String(128), nullable=False),
        sa.Column("kernel_hash", sa.String(128), nullable=False),
        sa.Column("backend", sa.String(32), nullable=False),
        sa.Column("arch", sa.String(128), nullable=False),
        sa.Column("device_name", sa.String(128), nullable=False),
        sa.Column("cu_count", sa.Integer(), nullable=False),
        sa.Column("warp_size", sa.Integer(), nullable=False),
        sa.Column("triton_version", sa.String(128), nullable=False),
        sa.Column("spec_len", sa.Integer(), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("vocab", sa.Integer(), nullable=False),
        sa.Column("dtype", sa.String(16), nullable=False),
        sa.Column("draft_probs", sa.Boolean(), nullable=False),
        sa.Column("torch_version", sa.String(128), nullable=False),
        sa.Column("runtime_version", sa.String(128), nullable=False),
        sa.Column("spectune_version", sa.String(128), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("tuned_p20_us", sa.Float(), nullable=False),
        sa.Column("tuned_p50_us", sa.Float(), nullable=False),
        sa.Column("tuned_p80_us", sa.Float(), nullable=False),
        sa.Column("default_p20_us", sa.Float(), nullable=False),
        sa.Column("default_p50_us", sa.Float(), nullable=False),
        sa.Column("default_p80_us", sa.Float(), nullable=False),
        sa.Column("speedup", sa.Float(), nullable=False),
        sa.Column("trials", sa.Integer(), nullable=False),
        sa.Column("tuning_seconds", sa.Float(), nullable=False),
        sa.Column("tuned_at", sa.DateTime(), nullable=False),
        sa.Column("host", sa.String(256), nullable=False),
        sa.Column("study", sa.String(256), nullable=False),
        sa.UniqueConstraint(*_KEY, name="uq_tuned_configs_key"),
    )


def downgrade() -> None:
    op.drop_table("tuned_configs")
