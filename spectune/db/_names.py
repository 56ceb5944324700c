"""Checks of the strings a row holds, so hostile names never reach SQL, files or terminals.

SQL only goes through SQLAlchemy with bound parameters, so these checks are not what
keeps the database safe; they keep names usable as file names (``vllm-json`` export),
printable in a terminal (no control or bidi characters) and bounded in size.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["NAME_MAX", "TEXT_MAX", "check_config_key", "check_name", "check_text", "shorten"]

#: Longest identity name (device, arch, kernel, versions, hashes).
NAME_MAX = 128
#: Longest free text (host, study).
TEXT_MAX = 256

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+\-]*\Z")
_CONFIG_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def check_name(what: str, value: object) -> str:
    """Return ``value`` if it is a safe identity name, else raise naming ``what``.

    Safe: 1 to :data:`NAME_MAX` characters of ASCII letters, digits and ``_ . + -``,
    starting with a letter or digit (so it can be part of a file name).
    """
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__}")
    if len(value) > NAME_MAX or not _NAME.match(value):
        raise ValueError(
            f"{what} must be 1-{NAME_MAX} characters of letters, digits, '_', '.', '+', '-' "
            f"(starting with a letter or digit), got {shorten(value)}"
        )
    return value


def check_text(what: str, value: object) -> str:
    """Return ``value`` if it is printable text of at most :data:`TEXT_MAX` characters."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__}")
    if len(value) > TEXT_MAX:
        raise ValueError(f"{what} must be at most {TEXT_MAX} characters, got {len(value)}")
    for char in value:
        if unicodedata.category(char).startswith("C"):
            raise ValueError(
                f"{what} must not contain control or format characters, got {shorten(value)}"
            )
    return value


def check_config_key(value: object) -> str:
    """Return ``value`` if it is a parameter name (a Python identifier, ASCII)."""
    if not isinstance(value, str) or len(value) > 64 or not _CONFIG_KEY.match(value):
        raise ValueError(f"config key must be an identifier, got {shorten(value)}")
    return value


def shorten(value: object, *, limit: int = 80) -> str:
    """``value`` for an error message: ASCII-escaped (no control characters) and bounded."""
    text = ascii(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
