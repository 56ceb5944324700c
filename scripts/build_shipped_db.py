"""Build the database shipped inside the package: ``spectune/data/tuned.db``.

The shipped database holds only rows measured on the hardware they name. Until such
rows exist it ships empty, with the schema at the current revision. To add rows,
export them from the database of a tuning run on real hardware and pass the file:

    python scripts/build_shipped_db.py                      # empty, with the schema
    python scripts/build_shipped_db.py --rows mi300x.json   # with measured rows

Rows of the ``cpu-interpreter`` backend are refused: they are not hardware
measurements. The file is written in rollback-journal mode and vacuumed, so it is one
small self-contained file that readers open read-only and immutable.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spectune.db import open_store, read_rows_file
from spectune.db._locations import shipped_db_path
from spectune.db._store import seal_database


def build(*, out: Path, rows_file: Path | None) -> int:
    """Write the shipped database to ``out``; returns the number of rows in it."""
    rows = read_rows_file(rows_file) if rows_file is not None else []
    simulated = [r for r in rows if r.device.backend == "cpu-interpreter"]
    if simulated:
        raise SystemExit(
            f"{rows_file}: {len(simulated)} rows were measured under the CPU interpreter; "
            "the shipped database holds only rows measured on the hardware they name"
        )
    tmp = out.with_name(out.name + ".building")
    for stale in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
        stale.unlink(missing_ok=True)
    with open_store(tmp) as store:
        if rows:
            store.record_many(rows)
        count = store.count()
    seal_database(tmp)  # one self-contained file, as readers open it read-only
    tmp.replace(out)
    return count


def main() -> int:
    parser = argparse.ArgumentParser(description="Build spectune/data/tuned.db.")
    parser.add_argument("--out", type=Path, default=shipped_db_path())
    parser.add_argument("--rows", type=Path, help="JSON or CSV file of measured rows")
    args = parser.parse_args()
    count = build(out=args.out, rows_file=args.rows)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes, {count} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
