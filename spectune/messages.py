"""Messages for people: an error as one printable line, a value shortened for a message.

Pure standard library, shared by every part (the database, the tuner, the vLLM plugin,
the command line), so an error reads the same wherever it is reported.
"""

from __future__ import annotations

__all__ = ["one_line", "shorten"]


def one_line(error: BaseException | str, *, limit: int = 300) -> str:
    """The first line of an error's message, printable and at most ``limit`` characters.

    An ``OSError`` with a ``strerror`` reads as ``FILE: REASON`` (its ``str`` repeats the
    errno). An error with an empty message reads as its type's name.
    """
    if isinstance(error, OSError) and error.strerror:
        text = f"{error.filename}: {error.strerror}" if error.filename else error.strerror
    else:
        text = str(error)
    lines = text.strip().splitlines()
    if lines:
        line = lines[0]
    else:
        line = type(error).__name__ if isinstance(error, BaseException) else "unknown error"
    line = "".join(c if c.isprintable() else "?" for c in line)
    return line if len(line) <= limit else line[: limit - 3] + "..."


def shorten(value: object, *, limit: int = 80) -> str:
    """``value`` for an error message: ASCII-escaped (no control characters) and bounded."""
    text = ascii(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
