"""Triton's interpreter without its repeated patching of ``triton.language`` on every call
of a ``@triton.jit`` helper.

Under ``TRITON_INTERPRET=1`` a kernel launch patches ``triton.language`` once (its
builtins pointed at the interpreter's semantics), runs the grid, and restores it. But
every call of a jit *helper* from inside the kernel (our own helpers, and Triton's
``tl.max``, ``tl.sum``, ``tl.zeros``, which are jit functions too) patches the language
modules again: it scans each module with ``inspect.getmembers`` and re-wraps only members
that are still builtins, which after the first patch are none. That scan was 40 % of the
interpreter time of the fused sampler's tests (cProfile: 5,044 scans for 20 programs).

:func:`skip_repeated_patching` makes a helper call skip the patching when every language
module in the helper's globals is already patched (its ``where`` is no longer a builtin),
and otherwise runs Triton's own code. The kernel executes the same operations either way
(``tests/test_interpreter.py`` checks tokens are equal with and without). It is installed
for the test processes only: the pytest process (``tests/conftest.py``) and the Python
processes the tests start (sweep workers, engines, the CLI), through
``tests/_site/sitecustomize.py`` on their ``PYTHONPATH``, which calls
:func:`install_on_import` so that Triton is patched when its interpreter is imported and
a process that never imports Triton pays nothing. spectune itself never patches Triton.
If Triton's interpreter no longer has the structure this relies on, nothing is patched.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import inspect
import sys
import types
from typing import Any

__all__ = ["install_on_import", "installed", "restore_patching", "skip_repeated_patching"]

_INTERPRETER_MODULE = "triton.runtime.interpreter"

# Triton's own helper call is kept on the class itself, not in this module: the test
# processes may hold two copies of this module (the one sitecustomize loads before
# ``tests`` is importable, and ``tests._interpreter``), and both must see one state.
_ORIGINAL_ATTRIBUTE = "_spectune_triton_call"


def _can_patch(interpreter: Any) -> bool:
    """Whether Triton's helper call is the one this module knows: patch, rewrite, call."""
    helper_class = getattr(interpreter, "InterpretedFunction", None)
    call = vars(helper_class).get("__call__") if helper_class is not None else None
    if call is None or not hasattr(interpreter, "InterpreterError"):
        return False
    try:
        source = inspect.getsource(call)
    except (OSError, TypeError):
        return False
    return "_patch_lang(self.fn)" in source and "self.rewrite()" in source


def skip_repeated_patching(interpreter: types.ModuleType | None = None) -> bool:
    """Install the shortcut into Triton's ``interpreter`` module (imported if not given);
    ``True`` if installed (idempotent)."""
    if interpreter is None:
        from triton.runtime import interpreter
    if installed(interpreter):
        return True
    if not _can_patch(interpreter):
        return False
    original = interpreter.InterpretedFunction.__call__
    language_modules: dict[object, tuple[Any, ...]] = {}

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        # Imported here: the shortcut may be installed while Triton is still importing.
        import triton.language as tl

        fn = self.fn
        modules = language_modules.get(fn)
        if modules is None:
            # What Triton's _patch_lang would patch for this helper.
            modules = tuple(v for v in fn.__globals__.values() if v is tl or v is tl.core)
            language_modules[fn] = modules
        if modules and not any(tl.core.is_builtin(module.where) for module in modules):
            rewritten = self.rewrite()
            try:
                return rewritten(*args, **kwargs)
            except Exception as exc:  # as Triton's own helper call reports it
                raise interpreter.InterpreterError(repr(exc)) from exc
        return original(self, *args, **kwargs)

    interpreter.InterpretedFunction.__call__ = call
    setattr(interpreter.InterpretedFunction, _ORIGINAL_ATTRIBUTE, original)
    return True


def installed(interpreter: types.ModuleType | None = None) -> bool:
    """Whether the shortcut is in Triton's ``interpreter`` module (by any copy of this
    module)."""
    if interpreter is None:
        from triton.runtime import interpreter
    return _ORIGINAL_ATTRIBUTE in vars(interpreter.InterpretedFunction)


def restore_patching() -> None:
    """Put Triton's own helper call back."""
    from triton.runtime import interpreter

    helper_class = interpreter.InterpretedFunction
    original = vars(helper_class).get(_ORIGINAL_ATTRIBUTE)
    if original is None:
        return
    helper_class.__call__ = original
    delattr(helper_class, _ORIGINAL_ATTRIBUTE)


class _PatchAfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds Triton's interpreter module through the other finders, runs it, then installs
    the shortcut into it."""

    def __init__(self) -> None:
        self._loader: Any = None

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != _INTERPRETER_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        sys.meta_path[:] = [finder for finder in sys.meta_path if finder is not self]
        skip_repeated_patching(module)


def install_on_import() -> None:
    """Install the shortcut once Triton's interpreter is imported (now, if it is)."""
    module = sys.modules.get(_INTERPRETER_MODULE)
    if module is not None:
        skip_repeated_patching(module)
    elif not any(isinstance(finder, _PatchAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport())
