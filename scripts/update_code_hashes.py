"""Rewrite spectune/data/code_hashes.json after editing a kernel family's hashed code.

The memo lets every process skip parsing the shipped kernels to compute their source
hash (see :mod:`spectune.kernels._code_hash`); tests/kernels/test_code_hash.py fails
while it is out of date. Its keys are the hashed modules' names (what each registered
family's ``source_modules`` lists).

    python scripts/update_code_hashes.py
"""

from __future__ import annotations

from spectune.kernels import FAMILIES

# The kernels' own maintenance tool: the memo it writes belongs to the kernels.
from spectune.kernels._code_hash import write_memo


def main() -> None:
    hashed = {module for family in FAMILIES.values() for module in family.source_modules}  # type: ignore[attr-defined]
    print(f"wrote {write_memo(sorted(hashed))}")


if __name__ == "__main__":
    main()
