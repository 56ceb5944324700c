"""The report of a night: Markdown, a static HTML page with PNG plots, and JSON.

Plots: the speedup of the tuned config over the default per shape (tonight's
measurements), each shape's speedup across nights (the database's history), and at which
evaluation each study tonight found its best. Everything a page shows is escaped: shape
names and messages come from databases and errors.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spectune.db import NightlyResult
    from spectune.tuning.nightly import NightReport, Work

__all__ = ["report_json", "shape_label", "write_report"]

# Most shapes drawn in the history plot (the most recently measured): a legend of more
# is unreadable.
_HISTORY_SHAPES = 8
_RESULT_COLUMNS = ("shape", "action", "why", "verdict", "default µs", "tuned µs", "speedup",
                   "vs vLLM", "evals (best at)", "s")


def shape_label(kernel: str, problem: Any) -> str:
    """``rejection_sample k=4 B=8 V=128256 bfloat16`` (``no-dp`` without draft probs)."""
    return (f"{kernel} k={problem.spec_len} B={problem.batch} V={problem.vocab} "
            f"{problem.dtype}{'' if problem.draft_probs else ' no-dp'}")


def report_json(
    reports: Sequence[NightReport], *, exit_status: int, files: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The night as one JSON-able object (``spectune nightly --json``)."""
    return {
        "exit_status": exit_status,
        "needs_person": sum(len(r.needs_person) for r in reports),
        "report": files or {},
        "databases": [_database_json(r) for r in reports],
    }


def write_report(
    reports: Sequence[NightReport], *, out: Path, history: dict[str, list[NightlyResult]],
    exit_status: int,
) -> dict[str, str]:
    """Write ``report.md``, ``index.html``, ``report.json`` and the plots into ``out``.

    Args:
        reports: One per database.
        out: The folder (created).
        history: Each database's recorded results over every night (for the trend plot).
        exit_status: What the command exits with (stated in the report).

    Returns:
        What was written: ``markdown``, ``html``, ``json`` and each plot, by name.
    """
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    plots: list[tuple[str, str]] = []
    for index, report in enumerate(reports):
        suffix = "" if len(reports) == 1 else f"-{index + 1}"
        for name, title, draw in (
            ("speedup", "Speedup of the tuned config over the default, tonight", _speedup_plot),
            ("history", "Speedup per shape across nights", _history_plot),
            ("evaluations", "Evaluations to the best config, tonight", _evaluations_plot),
        ):
            path = out / f"{name}{suffix}.png"
            data = history.get(report.database, []) if name == "history" else report.results
            if draw(data, path, title=f"{title}{_of(report, reports)}"):
                files[f"{name}{suffix}"] = str(path)
                plots.append((path.name, f"{title}{_of(report, reports)}"))
    markdown = _markdown(reports, plots=plots, exit_status=exit_status)
    (out / "report.md").write_text(markdown, encoding="utf-8")
    (out / "index.html").write_text(_html(reports, plots=plots, exit_status=exit_status),
                                    encoding="utf-8")
    files.update(markdown=str(out / "report.md"), html=str(out / "index.html"),
                 json=str(out / "report.json"))
    (out / "report.json").write_text(
        json.dumps(report_json(reports, exit_status=exit_status, files=files), indent=2),
        encoding="utf-8")
    return files


def _of(report: NightReport, reports: Sequence[NightReport]) -> str:
    return "" if len(reports) == 1 else f" ({report.database})"


def _timing_json(timing: Any) -> dict[str, float] | None:
    if timing is None:
        return None
    return {"p20_us": timing.p20, "p50_us": timing.p50, "p80_us": timing.p80}


def _result_json(r: NightlyResult) -> dict[str, Any]:
    p = r.problem
    return {
        "kernel": r.kernel, "spec_len": p.spec_len, "batch": p.batch, "vocab": p.vocab,
        "dtype": p.dtype, "draft_probs": p.draft_probs, "action": r.action,
        "reason": r.reason, "verdict": r.verdict, "config": r.config,
        "tuned": _timing_json(r.tuned), "default": _timing_json(r.default),
        "recorded_p50_us": r.recorded_p50,
        "speedup": None if r.speedup is None else round(r.speedup, 4),
        "evaluations": r.evaluations, "evaluations_to_best": r.evaluations_to_best,
        "seconds": round(r.seconds, 3), "message": r.message,
        # The serving config against vLLM's own function (measured tonight, or as the
        # row recorded it): vLLM's p50 over the config's, in the same comparison.
        "vs_vllm": r.vs_vllm, "vllm_p50_us": r.vllm_p50, "vllm_version": r.vllm_version,
        "served_p50_us": r.served_p50,
        "vs_vllm_ratio": None if r.vs_vllm_ratio is None else round(r.vs_vllm_ratio, 4),
    }


def _work_json(w: Work) -> dict[str, Any]:
    p = w.item.problem
    return {"kernel": w.item.kernel, "spec_len": p.spec_len, "batch": p.batch,
            "vocab": p.vocab, "dtype": p.dtype, "draft_probs": p.draft_probs,
            "action": w.action, "why": w.why, "reason": w.reason}


def _database_json(r: NightReport) -> dict[str, Any]:
    return {
        "database": r.database, "job": r.job, "run_id": None if r.run is None else r.run.id,
        "status": r.status, "error": r.error, "device": r.device.as_dict(),
        "software": r.software.as_dict(), "driver": r.driver, "budget_seconds": r.budget,
        "seconds": round(r.seconds, 3), "started": r.started.isoformat(),
        "counts": r.counts(), "planned": [_work_json(w) for w in r.planned],
        "results": [_result_json(x) for x in r.results],
        "needs_person": [_result_json(x) for x in r.needs_person],
        "deferred": [_work_json(w) for w in r.deferred],
    }


def _result_cells(r: NightlyResult) -> list[str]:
    from spectune.cli.db import NOT_COMPARED, short_us

    why = r.reason.split(":", 1)[0]
    evals = "" if r.evaluations is None else (
        f"{r.evaluations} ({r.evaluations_to_best})" if r.evaluations_to_best else
        str(r.evaluations))
    return [
        shape_label(r.kernel, r.problem), r.action, why, r.verdict,
        "" if r.default is None else short_us(r.default.p50),
        "" if r.tuned is None else short_us(r.tuned.p50),
        "" if r.speedup is None else f"{r.speedup:.2f}x",
        NOT_COMPARED if r.vs_vllm_ratio is None else f"{r.vs_vllm_ratio:.2f}x",
        evals, f"{r.seconds:.1f}",
    ]


def _header(report: NightReport) -> list[str]:
    s = report.software
    return [
        f"database: {report.database}",
        f"device: {report.device.describe()}",
        f"software: triton {s.triton}, torch {s.torch}, runtime {s.runtime}, "
        f"driver {report.driver}, spectune {s.spectune}",
        f"status: {report.status} after {report.seconds:.0f} s of a {report.budget:.0f} s "
        f"budget; {len(report.results)} done, {len(report.deferred)} left for the next night"
        + (f"; error: {report.error}" if report.error else ""),
    ]


def _md_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _verdict_line(reports: Sequence[NightReport], exit_status: int) -> str:
    people = sum(len(r.needs_person) for r in reports)
    if exit_status == 0:
        return "**Clean**: nothing needs a person."
    return (f"**Needs a person** (exit status {exit_status}): {people} shape(s) regressed, "
            "broke or failed without a fix tonight"
            + ("" if all(not r.error for r in reports) else "; a database failed") + ".")


def _markdown(reports: Sequence[NightReport], *, plots: Sequence[tuple[str, str]],
              exit_status: int) -> str:
    first = reports[0]
    out = [f"# spectune nightly: {first.job}, {first.started:%Y-%m-%d %H:%M} UTC", "",
           _verdict_line(reports, exit_status), ""]
    for report in reports:
        out += ["## " + report.database, ""] + [f"- {line}" for line in _header(report)] + [""]
        if report.needs_person:
            out += ["### Needs a person", "", _md_table(
                ("shape", "action", "verdict", "what"),
                [(shape_label(r.kernel, r.problem), r.action, r.verdict, r.message)
                 for r in report.needs_person]), ""]
        out += ["### Results", ""]
        out += [_md_table(_RESULT_COLUMNS, [_result_cells(r) for r in report.results])
                if report.results else "Nothing was done.", ""]
        if report.deferred:
            out += ["### Left for the next night (budget)", ""]
            out += [f"- {shape_label(w.item.kernel, w.item.problem)}: {w.action} ({w.reason})"
                    for w in report.deferred] + [""]
    if plots:
        out += ["## Plots", ""] + [f"![{title}]({name})" for name, title in plots] + [""]
    return "\n".join(out)


def _html(reports: Sequence[NightReport], *, plots: Sequence[tuple[str, str]],
          exit_status: int) -> str:
    e = html.escape
    first = reports[0]

    def table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
        head = "".join(f"<th>{e(c)}</th>" for c in columns)
        body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>"
                       for row in rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    verdict = _verdict_line(reports, exit_status).replace("**", "")
    css = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}"
           "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;"
           "padding:.25em .5em;text-align:left;font-size:.9em}th{background:#f4f4f4}"
           ".bad{color:#b00020}.good{color:#006400}img{max-width:100%;margin:1em 0}")
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>spectune nightly: {e(first.job)}</title><style>{css}</style></head><body>",
        f"<h1>spectune nightly: {e(first.job)}, {first.started:%Y-%m-%d %H:%M} UTC</h1>",
        f"<p class='{'good' if exit_status == 0 else 'bad'}'><b>{e(verdict)}</b></p>",
    ]
    for report in reports:
        parts.append(f"<h2>{e(report.database)}</h2><ul>")
        parts += [f"<li>{e(line)}</li>" for line in _header(report)]
        parts.append("</ul>")
        if report.needs_person:
            parts.append("<h3 class='bad'>Needs a person</h3>")
            parts.append(table(("shape", "action", "verdict", "what"), [
                (shape_label(r.kernel, r.problem), r.action, r.verdict, r.message)
                for r in report.needs_person]))
        parts.append("<h3>Results</h3>")
        parts.append(table(_RESULT_COLUMNS, [_result_cells(r) for r in report.results])
                     if report.results else "<p>Nothing was done.</p>")
        if report.deferred:
            parts.append("<h3>Left for the next night (budget)</h3><ul>")
            parts += [f"<li>{e(shape_label(w.item.kernel, w.item.problem))}: "
                      f"{e(w.action)} ({e(w.reason)})</li>" for w in report.deferred]
            parts.append("</ul>")
    for name, title in plots:
        parts.append(f"<h2>{e(title)}</h2><img src='{e(name)}' alt='{e(title)}'>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: a nightly job has no display
    import matplotlib.pyplot as plt

    return plt


def _speedup_plot(results: Sequence[NightlyResult], path: Path, *, title: str) -> bool:
    shown = [r for r in results if r.speedup is not None]
    if not shown:
        return False
    plt = _pyplot()
    labels = [f"{shape_label(r.kernel, r.problem)} ({r.action})" for r in shown]
    colors = ["#b00020" if r.verdict in ("regressed", "broken") else "#1f77b4" for r in shown]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.35 * len(shown)))
    ax.barh(range(len(shown)), [r.speedup for r in shown], color=colors)
    ax.set_yticks(range(len(shown)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("default p50 / tuned p50 (measured side by side; red: regressed)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _history_plot(history: Sequence[NightlyResult], path: Path, *, title: str) -> bool:
    series: dict[str, list[tuple[Any, float]]] = {}
    for r in history:
        if r.speedup is not None and r.finished_at is not None:
            series.setdefault(shape_label(r.kernel, r.problem), []).append(
                (r.finished_at, r.speedup))
    if not series:
        return False
    plt = _pyplot()
    latest = sorted(series, key=lambda k: max(t for t, _ in series[k]), reverse=True)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for label in latest[:_HISTORY_SHAPES]:
        points = sorted(series[label])
        ax.plot([t for t, _ in points], [s for _, s in points], marker="o", label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel("default p50 / tuned p50")
    ax.set_title(title + ("" if len(latest) <= _HISTORY_SHAPES else
                          f" (the {_HISTORY_SHAPES} latest of {len(latest)} shapes)"),
                 fontsize=10)
    ax.legend(fontsize=7, loc="best")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _evaluations_plot(results: Sequence[NightlyResult], path: Path, *, title: str) -> bool:
    shown = [r for r in results if r.evaluations and r.evaluations_to_best]
    if not shown:
        return False
    plt = _pyplot()
    labels = [shape_label(r.kernel, r.problem) for r in shown]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.35 * len(shown)))
    ax.barh(range(len(shown)), [r.evaluations for r in shown], color="#dddddd",
            label="evaluations")
    ax.barh(range(len(shown)), [r.evaluations_to_best for r in shown], color="#2ca02c",
            label="evaluations to the best")
    ax.set_yticks(range(len(shown)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("evaluations")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
