"""Seeded fuzzing of ``spectune replay`` on broken T4 files (issue 16, finding 9).

A small valid T4 document is mutated (garbage bytes, truncated or corrupted gzip, a
value of the wrong type at a random JSON path, huge, negative, zero or non-finite
numbers, missing keys, several at once) and replayed through click's CliRunner. Whatever
the file, the command ends with exit code 0 (the file was still valid) or 1 with exactly
one line, ``Error: FILE: ...``; no exception escapes (in a terminal: no traceback), and
nothing is read as Ctrl-D ("Aborted!").

hypothesis is not a dependency of the project: the draws come from ``random.Random``
with fixed seeds, so every case is reproducible from its seed and index, which a
failure names along with the mutation.
"""

from __future__ import annotations

import gzip
import json
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from spectune.cli import main
from spectune.search.replay import write_t4

#: Mutated files per kind of mutation (each replay of a still-valid file takes ~20 ms);
#: SPECTUNE_FUZZ_DRAWS raises it for a longer hunt.
DRAWS = int(os.environ.get("SPECTUNE_FUZZ_DRAWS", "60"))

JsonPath = tuple[str | int, ...]

#: Values of every JSON type, to put where another type belongs.
VALUES: list[Any] = [None, True, False, 0, 1, -1, 2.5, "", "x", "correct", [], [1, "a"],
                     {}, {"name": "time"}, [[[]]]]
#: Number literals written into the JSON text as they are (1e400 reads as inf, NaN and
#: Infinity are Python's extensions, 10**30 is beyond int64).
NUMBERS = ["1e400", "-1e400", "NaN", "Infinity", "-Infinity", "-1", "-0.0", "0", "1e-320",
           "1e308", "-5e-324", "1000000000000000000000000000000", "4.0"]


def _doc() -> dict[str, Any]:
    rows = [({"bx": bx, "mode": mode}, None if bx == 64 and mode == "b" else 1.0 + bx / 16,
             [1.0 + bx / 16, 1.1 + bx / 16], 10.0)
            for bx in (16, 32, 64) for mode in ("a", "b")]
    results = []
    for config, time, runtimes, compile_time in rows:
        ok = time is not None
        results.append({
            "timestamp": "2026-01-01 00:00:00+00:00",
            "configuration": config,
            "invalidity": "correct" if ok else "runtime",
            "correctness": 1 if ok else 0,
            "measurements": [{"name": "time", "value": time if ok else "RuntimeFailedConfig",
                              "unit": "ms"}],
            "times": {"compilation": compile_time, "framework": 1.0, "search_algorithm": 0,
                      "validation": 0, **({"runtimes": runtimes} if ok else {})},
            "objectives": ["time"],
        })
    return {"schema_version": "1.0.0", "metadata": {"timeunit": "miliseconds"},
            "results": results}


def _paths(node: Any, prefix: JsonPath = ()) -> list[JsonPath]:
    """Every JSON path in ``node``, the root (``()``) included."""
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += _paths(value, (*prefix, i))
    return out


def _get(doc: Any, path: JsonPath) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def _put(doc: Any, path: JsonPath, value: Any) -> Any:
    """``doc`` with the value at ``path`` replaced (the root too)."""
    if not path:
        return value
    _get(doc, path[:-1])[path[-1]] = value
    return doc


class _Text:
    """A document on its way to the file: JSON values, then literal text substitutions."""

    def __init__(self, doc: Any) -> None:
        self.doc = doc
        self.literals: dict[str, str] = {}

    def literal(self, text: str) -> str:
        """A placeholder string that becomes ``text`` verbatim in the JSON."""
        marker = f"@@{len(self.literals)}@@"
        self.literals[marker] = text
        return marker

    def render(self) -> str:
        text = json.dumps(self.doc)
        for marker, literal in self.literals.items():
            text = text.replace(json.dumps(marker), literal)
        return text


def _wrong_type(rng: random.Random, t: _Text) -> str:
    path = rng.choice(_paths(t.doc))
    old = _get(t.doc, path)
    value = rng.choice([v for v in VALUES if type(v) is not type(old)])
    t.doc = _put(t.doc, path, value)
    return f"{_show(path)} = {json.dumps(value)}"


def _bad_number(rng: random.Random, t: _Text) -> str:
    numeric = [p for p in _paths(t.doc) if isinstance(_get(t.doc, p), (int, float))]
    if not numeric:  # an earlier mutation replaced what held them
        return "no number left"
    path = rng.choice(numeric)
    literal = rng.choice(NUMBERS)
    t.doc = _put(t.doc, path, t.literal(literal))
    return f"{_show(path)} = {literal}"


def _missing_key(rng: random.Random, t: _Text) -> str:
    objects = [p for p in _paths(t.doc) if isinstance(_get(t.doc, p), dict) and _get(t.doc, p)]
    if not objects:
        return "no key left"
    path = rng.choice(objects)
    key = rng.choice(sorted(_get(t.doc, path)))
    del _get(t.doc, path)[key]
    return f"del {_show((*path, key))}"


def _show(path: JsonPath) -> str:
    return "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in path) or "<root>"


Mutation = Callable[[random.Random, _Text], str]
DOCUMENT_MUTATIONS: dict[str, Mutation] = {
    "wrong-type": _wrong_type, "bad-number": _bad_number, "missing-key": _missing_key,
}


def _write_document(rng: random.Random, tmp_path: Path, kind: str) -> tuple[Path, str]:
    t = _Text(_doc())
    if kind == "several":
        what = "; ".join(rng.choice(list(DOCUMENT_MUTATIONS.values()))(rng, t)
                         for _ in range(rng.randint(2, 4)))
    else:
        what = DOCUMENT_MUTATIONS[kind](rng, t)
    path = tmp_path / "fuzz_T4.json.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write(t.render())
    return path, what


def _write_bytes(rng: random.Random, tmp_path: Path, kind: str) -> tuple[Path, str]:
    valid = gzip.compress(json.dumps(_doc()).encode())
    name = "fuzz_T4.json.gz"
    if kind == "garbage":
        data = rng.randbytes(rng.randint(0, 300))
        name = rng.choice(["fuzz_T4.json.gz", "fuzz_T4.json"])
        what = f"{len(data)} random bytes as {name}"
    elif kind == "truncated-gzip":
        cut = rng.randrange(len(valid))
        data, what = valid[:cut], f"gzip cut at {cut} of {len(valid)} bytes"
    elif kind == "corrupt-gzip":
        data = bytearray(valid)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(data))
            data[at] ^= rng.randint(1, 255)
        what = "gzip with flipped bytes"
    else:  # truncated-json: valid gzip of a JSON text cut short
        text = json.dumps(_doc()).encode()
        cut = rng.randrange(len(text))
        data, what = gzip.compress(text[:cut]), f"JSON text cut at {cut}"
    path = tmp_path / name
    path.write_bytes(bytes(data))
    return path, what


KINDS = ["garbage", "truncated-gzip", "corrupt-gzip", "truncated-json", *DOCUMENT_MUTATIONS,
         "several"]


def test_the_unmutated_document_replays(tmp_path: Path) -> None:
    """The base every mutation starts from is a valid file (so an error is the mutation's),
    and the writer of the project writes the same shape."""
    path = tmp_path / "base_T4.json.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write(json.dumps(_doc()))
    result = _replay(path)
    assert result.exit_code == 0, result.output
    written = json.loads(write_t4(tmp_path / "w.json", [({"a": 1}, 1.0, [1.0], 1.0)]).read_text())
    assert set(written["results"][0]) <= set(_doc()["results"][0])


@pytest.mark.parametrize("kind", KINDS)
def test_a_broken_file_is_exit_1_and_one_line(kind: str, tmp_path: Path) -> None:
    rng = random.Random(f"issue16-{kind}")
    outcomes = {0: 0, 1: 0}
    for i in range(DRAWS):
        if kind in DOCUMENT_MUTATIONS or kind == "several":
            path, what = _write_document(rng, tmp_path, kind)
        else:
            path, what = _write_bytes(rng, tmp_path, kind)
        result = _replay(path)
        where = f"{kind} #{i}: {what}"
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            f"{where}: {result.exception!r}"
        )
        assert "Traceback" not in result.output and "Aborted!" not in result.output, where
        assert result.exit_code in (0, 1), f"{where}: exit {result.exit_code}: {result.output}"
        if result.exit_code == 1:
            lines = result.output.splitlines()
            assert len(lines) == 1 and lines[0].startswith(f"Error: {path}: "), (
                f"{where}: {result.output!r}"
            )
        else:  # still a valid file: the summary, as JSON on the last line
            summary = json.loads(result.output.strip().splitlines()[-1])
            assert 0 <= summary["results"][0]["median_fraction"] <= 1, f"{where}: {summary}"
        outcomes[result.exit_code] += 1
        path.unlink()
    # Garbage and cut files are never readable (a flipped gzip header byte, or damage
    # inside the document, may leave a valid file).
    if kind in ("garbage", "truncated-gzip", "truncated-json"):
        assert outcomes[0] == 0, outcomes
    assert outcomes[1] > 0, outcomes


def _replay(path: Path) -> Any:
    return CliRunner().invoke(
        main, ["replay", str(path), "--budget", "5", "--repeats", "1", "--json"]
    )
