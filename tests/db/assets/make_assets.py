"""Writes the database files of older schemas kept as test assets (not a test).

Each file is written once, when its schema is current or just superseded, and then
kept unchanged: the migration tests must upgrade the real old file, not one rebuilt
by today's code. Run from the repository root only to add a new asset:

    python tests/db/assets/make_assets.py schema_0001.db
    python tests/db/assets/make_assets.py schema_0002.db
    python tests/db/assets/make_assets.py schema_0003.db
"""

from __future__ import annotations

import sys
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, text

from spectune.db._writer import migrations_dir

ROWS_0001 = [
    # kernel, hash, backend, arch, device, cus, warp, triton, k, batch, vocab, dtype, draft,
    # config, tuned p20/p50/p80, default p20/p50/p80, trials, seconds, tuned_at, host, study
    ("rejection_sample", "0123456789abcdef", "hip", "gfx942", "AMD_Instinct_MI300X", 304, 64,
     "3.2.0", 4, 8, 128256, "bfloat16", True, '{"BLOCK_V": 1024, "num_warps": 4, '
     '"waves_per_eu": 1}', 9.8, 10.0, 10.2, 14.5, 15.0, 15.5, 64, 42.5,
     "2025-11-01 12:00:00.000000", "node-a", "study-1"),
    ("rejection_sample", "0123456789abcdef", "cuda", "sm_90", "NVIDIA_H200", 132, 32,
     "3.2.0", 2, 64, 151936, "float16", False, '{"BLOCK_V": 2048, "num_warps": 8}',
     19.0, 20.0, 21.0, 29.0, 30.0, 31.0, 128, 90.0, "2025-11-02 08:30:00.250000",
     "node-b", "study-2"),
]  # fmt: skip


#: The history (JSON) revision 0002 adds to the first row of ROWS_0001 in its assets
#: (0002 and 0003).
HISTORY_0002 = (
    '[{"config": {"BLOCK_V": 2048, "num_warps": 8, "waves_per_eu": 2}, "tuned_p20_us": 10.4, '
    '"tuned_p50_us": 10.6, "tuned_p80_us": 10.9, "trials": 30, "tuning_seconds": 20.0, '
    '"tuned_at": "2025-10-01T09:00:00+00:00", "host": "node-c", "study": "study-0"}]'
)


def make_schema_0001(path: Path) -> None:
    _make(path, "0001")


def make_schema_0002(path: Path) -> None:
    _make(path, "0002")


def make_schema_0003(path: Path) -> None:
    """Revision 0003 (the nightly tables; no comparison with vLLM yet)."""
    _make(path, "0003")


def _make(path: Path, revision: str) -> None:
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        config = Config()
        config.set_main_option("script_location", str(migrations_dir()))
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
        for row in ROWS_0001:
            connection.execute(
                text(
                    "INSERT INTO tuned_configs (kernel, kernel_hash, backend, arch, "
                    "device_name, cu_count, warp_size, triton_version, spec_len, batch, "
                    "vocab, dtype, draft_probs, torch_version, runtime_version, "
                    "spectune_version, config, tuned_p20_us, tuned_p50_us, tuned_p80_us, "
                    "default_p20_us, default_p50_us, default_p80_us, speedup, trials, "
                    "tuning_seconds, tuned_at, host, study) VALUES (:a, :b, :c, :d, :e, :f, "
                    ":g, :h, :i, :j, :k, :l, :m, '2.6.0', 'rt-1', '0.1.0', :n, :o, :p, :q, "
                    ":r, :s, :t, :s / :p, :u, :v, :w, :x, :y)"
                ),
                dict(zip("abcdefghijklmnopqrstuvwxy", row, strict=True)),
            )
        if revision in ("0002", "0003"):
            connection.execute(
                text("UPDATE tuned_configs SET history = :h WHERE host = 'node-a'"),
                {"h": HISTORY_0002},
            )
    with engine.connect() as connection:
        connection.exec_driver_sql("VACUUM")
    engine.dispose()


if __name__ == "__main__":
    target = Path(__file__).parent / sys.argv[1]
    if target.exists():
        raise SystemExit(f"{target} exists: assets are written once and kept")
    recipes = {"schema_0001.db": make_schema_0001, "schema_0002.db": make_schema_0002,
               "schema_0003.db": make_schema_0003}
    if target.name not in recipes:
        raise SystemExit(f"no recipe for {target.name}")
    recipes[target.name](target)
    print(f"wrote {target}")
