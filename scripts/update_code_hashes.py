"""Rewrite spectune/data/code_hashes.json after editing a kernel family's hashed code.

The memo lets every process skip parsing the shipped kernels to compute their source
hash (see :mod:`spectune.kernels._code_hash`); tests/kernels/test_code_hash.py fails
while it is out of date.

    python scripts/update_code_hashes.py
"""

from __future__ import annotations

from spectune.kernels import FAMILIES
from spectune.kernels._code_hash import write_memo


def main() -> None:
    hashed = {module for family in FAMILIES.values() for module in family.source_modules}  # type: ignore[attr-defined]
    print(f"wrote {write_memo(sorted(hashed, key=lambda m: m.__name__))}")


if __name__ == "__main__":
    main()
