"""Run by every Python process the tests start (tests/conftest.py puts this folder on
their ``PYTHONPATH``): under ``TRITON_INTERPRET=1``, Triton's interpreter without its
repeated patching (``tests/_interpreter.py`` says why that changes no result)."""

from __future__ import annotations

import os

if os.environ.get("TRITON_INTERPRET") == "1":
    import importlib.util
    from pathlib import Path

    _PATH = Path(__file__).resolve().parents[1] / "_interpreter.py"
    _SPEC = importlib.util.spec_from_file_location("_spectune_test_interpreter", _PATH)
    if _SPEC is not None and _SPEC.loader is not None:
        _MODULE = importlib.util.module_from_spec(_SPEC)
        _SPEC.loader.exec_module(_MODULE)
        _MODULE.install_on_import()
