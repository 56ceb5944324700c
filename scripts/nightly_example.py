"""Render an example nightly report on CPU: planted rows, two nights (docs/nightly-example/).

    TRITON_INTERPRET=1 python scripts/nightly_example.py docs/nightly-example

A throwaway database gets rows planted the way a fleet's go wrong (one of an older
Triton, one measured under another torch, one whose "tuned" config is the default, one
recorded impossibly fast, one that no longer gives the exact result) beside a missing
shape; ``spectune nightly`` then runs two nights on the test suite's toy kernel family
(integer row sums: tests/tuning/toy_family.py) under the Triton interpreter. The second
night's report folder, and the first night's, are copied to OUT. Timings are CPU
interpreter wall time, not GPU figures.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "nightly-example")
    import os

    from spectune.kernels import FAMILIES
    from tests.tuning.toy_family import ToySumFamily

    FAMILIES["toy_sum"] = ToySumFamily()
    from spectune.db import open_store
    from spectune.promotion import Timing
    from tests.tuning import test_nightly as planted

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["SPECTUNE_USER_DB"] = str(root / "user.db")
        with open_store(root / "configs.db") as store:
            store.record_many([
                planted._row(2, planted.FAST, tuned=Timing(10, 11, 12), triton="3.1.0"),
                planted._row(3, planted.FAST, tuned=Timing(10, 11, 12), torch="2.12.0"),
                planted._row(4, planted.DEFAULT, tuned=Timing(10, 11, 12)),
                planted._row(5, planted.FAST, tuned=Timing(0.9, 1.0, 1.1)),
                planted._row(6, {"BLOCK": 64, "BUG": 1}, tuned=Timing(10, 11, 12)),
            ])
        job = planted._job(root, ks="[1, 2, 3, 4, 5, 6]")
        if out.exists():
            shutil.rmtree(out)
        for night in ("night-1", "night-2"):
            code, stdout, _ = planted._invoke(str(job), "--json")
            folder = Path(json.loads(stdout)["report"]["html"]).parent
            shutil.copytree(folder, out / night)
            print(f"{night}: exit status {code}, report {out / night / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
