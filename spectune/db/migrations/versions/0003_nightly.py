"""Nightly history: every night's run and what it found for each shape.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Literal column definitions, not the current model (see 0001). tuned_configs is not
    # touched: readers of tuned rows read a database of revision 0002 or 0003 alike.
    op.create_table(
        "nightly_runs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job", sa.String(128), nullable=False),
        sa.Column("host", sa.String(256), nullable=False),
        sa.Column("backend", sa.String(32), nullable=False),
        sa.Column("arch", sa.String(128), nullable=False),
        sa.Column("device_name", sa.String(128), nullable=False),
        sa.Column("cu_count", sa.Integer(), nullable=False),
        sa.Column("warp_size", sa.Integer(), nullable=False),
        sa.Column("triton_version", sa.String(128), nullable=False),
        sa.Column("torch_version", sa.String(128), nullable=False),
        sa.Column("runtime_version", sa.String(128), nullable=False),
        sa.Column("driver_version", sa.String(128), nullable=False),
        sa.Column("spectune_version", sa.String(128), nullable=False),
        sa.Column("budget_seconds", sa.Float(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("summary", sa.JSON(), nullable=True),
    )
    op.create_table(
        "nightly_results",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("kernel", sa.String(128), nullable=False),
        sa.Column("kernel_hash", sa.String(128), nullable=False),
        sa.Column("spec_len", sa.Integer(), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("vocab", sa.Integer(), nullable=False),
        sa.Column("dtype", sa.String(16), nullable=False),
        sa.Column("draft_probs", sa.Boolean(), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(1024), nullable=False),
        sa.Column("verdict", sa.String(32), nullable=False),
        sa.Column("config", sa.JSON(), nullable=True),
        sa.Column("tuned_p20_us", sa.Float(), nullable=True),
        sa.Column("tuned_p50_us", sa.Float(), nullable=True),
        sa.Column("tuned_p80_us", sa.Float(), nullable=True),
        sa.Column("default_p20_us", sa.Float(), nullable=True),
        sa.Column("default_p50_us", sa.Float(), nullable=True),
        sa.Column("default_p80_us", sa.Float(), nullable=True),
        sa.Column("recorded_p50_us", sa.Float(), nullable=True),
        sa.Column("evaluations", sa.Integer(), nullable=True),
        sa.Column("evaluations_to_best", sa.Integer(), nullable=True),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("message", sa.String(1024), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_nightly_results_run_id", "nightly_results", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_nightly_results_run_id", table_name="nightly_results")
    op.drop_table("nightly_results")
    op.drop_table("nightly_runs")
