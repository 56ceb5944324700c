"""Comparison with vLLM: how each tuned config compared with vLLM's own function.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

#: The nightly history's columns for the comparison with vLLM that a night measured or
#: found recorded (all nullable: results of earlier nights have none).
_NIGHTLY_COLUMNS = (
    ("vs_vllm", sa.String(16)),
    ("vllm_p50_us", sa.Float()),
    ("vllm_version", sa.String(128)),
    ("served_p50_us", sa.Float()),
)


def upgrade() -> None:
    # Literal column definitions, not the current model (see 0001). Rows already there
    # were never compared: the server default makes them "not measured", which the
    # plugin never routes on; readers of revisions 0002 and 0003 read them so too.
    op.add_column(
        "tuned_configs",
        sa.Column("vs_vllm", sa.String(16), nullable=False, server_default="not measured"),
    )
    op.add_column("tuned_configs", sa.Column("vllm_p50_us", sa.Float(), nullable=True))
    op.add_column("tuned_configs", sa.Column("vllm_version", sa.String(128), nullable=True))
    op.add_column("tuned_configs", sa.Column("vllm_reason", sa.String(256), nullable=True))
    # Peak device memory of one call, MiB, each side (NULL: not measured, or on CPU).
    op.add_column("tuned_configs", sa.Column("vllm_peak_mib", sa.Float(), nullable=True))
    op.add_column("tuned_configs", sa.Column("tuned_peak_mib", sa.Float(), nullable=True))
    for name, kind in _NIGHTLY_COLUMNS:
        op.add_column("nightly_results", sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nightly_results") as batch:
        for name, _ in reversed(_NIGHTLY_COLUMNS):
            batch.drop_column(name)
    with op.batch_alter_table("tuned_configs") as batch:
        for name in ("tuned_peak_mib", "vllm_peak_mib", "vllm_reason", "vllm_version",
                     "vllm_p50_us", "vs_vllm"):
            batch.drop_column(name)
