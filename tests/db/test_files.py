"""Rows in files: JSON and CSV round trips, vLLM-style export, strict parsing."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from spectune.db import VllmComparison, read_rows_file, write_rows_file
from spectune.db._fields import FIELDS, LATER_FIELDS
from spectune.db._files import rows_to_json, vllm_file_name, vllm_tables
from spectune.db.errors import InvalidRowError

from .conftest import H200, later, make_row

ROWS = [
    make_row(p50=10.123456789012345, host='quote " and, comma', study="line one"),
    make_row(batch=16, draft_probs=False, history=(make_row(host="old").provenance,),
             vllm=VllmComparison(version="0.33.0", reason="=vLLM's function raised")),
    make_row(device=H200, config={"BLOCK_V": 2048, "num_warps": 8}, dtype="float16",
             vllm=VllmComparison("faster", 12.5, "0.32.0")),
]


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_round_trip_is_exact(fmt: str, tmp_path: Path) -> None:
    path = tmp_path / f"rows.{fmt}"
    assert write_rows_file(ROWS, path, fmt=fmt) == [path]
    assert read_rows_file(path) == ROWS
    assert read_rows_file(path, fmt=fmt) == ROWS


def test_json_is_a_list_of_flat_rows(tmp_path: Path) -> None:
    data = json.loads(rows_to_json(ROWS))
    assert isinstance(data, list)
    assert [tuple(d) for d in data] == [FIELDS] * 3
    assert data[0]["config"] == ROWS[0].config


def test_csv_header_is_the_fields(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    write_rows_file(ROWS, path, fmt="csv")
    assert path.read_text().splitlines()[0] == ",".join(FIELDS)


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_files_written_before_the_comparison_read_as_not_measured(
    fmt: str, tmp_path: Path
) -> None:
    path = tmp_path / f"rows.{fmt}"
    later_names = [f.name for f in LATER_FIELDS]
    assert later_names == ["vs_vllm", "vllm_p50_us", "vllm_version", "vllm_reason",
                           "vllm_peak_mib", "tuned_peak_mib"]
    write_rows_file(ROWS, path, fmt=fmt)
    if fmt == "json":  # as spectune wrote it before schema revision 0004
        data = json.loads(path.read_text())
        path.write_text(json.dumps([{k: v for k, v in d.items() if k not in later_names}
                                    for d in data]))  # fmt: skip
    else:
        lines = list(csv.reader(io.StringIO(path.read_text(), newline="")))
        keep = len(FIELDS) - len(later_names)  # the new columns are the last ones
        assert lines[0][keep:] == later_names
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(line[:keep] for line in lines)
        path.write_text(out.getvalue())
    read = read_rows_file(path)
    assert [r.vllm for r in read] == [VllmComparison()] * len(ROWS)
    assert [r.replace_vllm(VllmComparison()) for r in ROWS] == read


def test_csv_writes_an_empty_cell_for_none(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    write_rows_file(ROWS[:1], path, fmt="csv")
    assert path.read_text().splitlines()[1].endswith(",not measured,,,,,")


def test_vllm_json_one_file_per_kernel_and_device(tmp_path: Path) -> None:
    written = write_rows_file(ROWS, tmp_path / "out", fmt="vllm-json")
    assert sorted(p.name for p in written) == [
        "kernel=rejection_sample,device_name=AMD_Instinct_MI300X.json",
        "kernel=rejection_sample,device_name=NVIDIA_H200.json",
    ]
    name = vllm_file_name(kernel="rejection_sample", device_name="AMD_Instinct_MI300X")
    mi300x = json.loads((tmp_path / "out" / name).read_text())
    assert mi300x == {
        "triton_version": "3.2.0",
        "spec_len=4,vocab=128256,dtype=bfloat16,draft_probs=false": {"16": ROWS[1].config},
        "spec_len=4,vocab=128256,dtype=bfloat16,draft_probs=true": {"8": ROWS[0].config},
    }


def test_vllm_json_keeps_the_newest_of_colliding_rows() -> None:
    from dataclasses import replace

    old = make_row(config={"BLOCK_V": 256, "num_warps": 1})
    new = make_row(software=replace(old.software, triton="3.3.0"), tuned_at=later(60),
                   config={"BLOCK_V": 512, "num_warps": 2})  # fmt: skip
    (table,) = vllm_tables([new, old]).values()
    assert table == {
        "triton_version": "3.3.0",
        "spec_len=4,vocab=128256,dtype=bfloat16,draft_probs=true": {"8": new.config},
    }
    # Rows of two Triton versions in one file: no single version to state.
    (table,) = vllm_tables([new, make_row(batch=16)]).values()
    assert "triton_version" not in table


def test_vllm_json_cannot_be_imported(tmp_path: Path) -> None:
    (path,) = write_rows_file(ROWS[:1], tmp_path / "out", fmt="vllm-json")
    with pytest.raises(InvalidRowError, match="pass a format"):
        read_rows_file(path.with_suffix(".vllm"))
    with pytest.raises(InvalidRowError, match="cannot import format 'vllm-json'"):
        read_rows_file(path, fmt="vllm-json")
    with pytest.raises(InvalidRowError, match="expected a JSON list"):
        read_rows_file(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not valid JSON"),
        ('[{"a": NaN}]', "not valid JSON"),
        ("[" * 100000 + "]" * 100000, "not valid JSON"),
        ('{"rows": []}', "expected a JSON list"),
        ("[1]", "row 1: row must be an object"),
    ],
)
def test_bad_json(text: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(InvalidRowError, match=message):
        read_rows_file(path)


def test_bad_row_is_named_by_number(tmp_path: Path) -> None:
    data = json.loads(rows_to_json(ROWS))
    data[2]["device_name"] = "NVIDIA H200; rm -rf /"
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InvalidRowError, match=r"rows.json: row 3: device_name must be"):
        read_rows_file(path)


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "rows.json"
    path.write_bytes(b"\xff\xfe[]")
    with pytest.raises(InvalidRowError, match="not UTF-8"):
        read_rows_file(path)


def _csv(tmp_path: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    path = tmp_path / "rows.csv"
    write_rows_file(ROWS, path, fmt="csv")
    lines = path.read_text().splitlines()
    path.write_text("\n".join(edit(lines)) + "\n")
    return path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda lines: [lines[0] + ",extra", *lines[1:]], "CSV header"),
        (lambda lines: [lines[0].replace("vocab", "vocabulary"), *lines[1:]], "CSV header"),
        (lambda lines: [lines[0], lines[1] + ",x"], "row 1: wrong number of fields"),
        (lambda lines: [lines[0], lines[1].replace(",304,", ",3o4,", 1)], "cu_count"),
        (lambda lines: [lines[0], lines[1].replace(",true,", ",yes,", 1)], "draft_probs"),
        (lambda lines: [lines[0], lines[1].replace('"{""BLOCK_V""', '"{BLOCK_V', 1)], "config"),
        (lambda lines: [lines[0], lines[1].replace(f",{ROWS[0].tuned.p50!r},", ",nan,", 1)],
         "tuned timing"),
    ],
)  # fmt: skip
def test_bad_csv(edit, message: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidRowError, match=message):
        read_rows_file(_csv(tmp_path, edit))


def test_unknown_export_format(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fmt"):
        write_rows_file(ROWS, tmp_path / "x", fmt="pickle")
