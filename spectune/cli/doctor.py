"""``spectune doctor``: what the vLLM plugin would do on this machine, and why."""

from __future__ import annotations

import json as json_module
from dataclasses import asdict

import click
from rich.console import Console

__all__ = ["doctor"]


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the diagnosis as JSON.")
@click.option("--self-test/--no-self-test", default=True, show_default=True,
              help="When the plugin would route: run a few verification calls through "
              "it beside vLLM's own function (slow on CPU: Triton's interpreter).")
@click.option("--vllm-seams", "seams_path", is_flag=False, flag_value="", default=None,
              metavar="[PATH]",
              help="Instead: list every vLLM function and method spectune replaces, with "
              "its signature and source hash, for the installed vLLM or the vLLM tree at "
              "PATH (a directory holding vllm/, or the package itself), against what "
              "spectune was written for; exit 1 naming each one that changed, or when the "
              "version is unknown.")
def doctor(as_json: bool, self_test: bool, seams_path: str | None) -> None:
    """Device identity, database, vLLM version, and whether the plugin would route.

    Reads the same controls as the plugin (SPECTUNE_DISABLE, SPECTUNE_DB,
    SPECTUNE_FORCE, TRITON_INTERPRET) and the same databases, in the same order. It
    checks what holds for every engine; whether an engine uses speculative decoding, and
    which model runner, is decided when it starts (the plugin logs it then).

    With --vllm-seams, checks vLLM's sources instead (read, not imported: an unpacked
    wheel works as well as an installed vLLM).
    """
    if seams_path is not None:
        _vllm_seams(seams_path, as_json=as_json)
        return
    from spectune.vllm import doctor as checks
    from spectune.vllm import passed_calls, routed_calls

    diagnosis = checks.diagnose()
    tests = checks.self_test() if self_test and diagnosis.would_route else []
    if as_json:
        report = {
            **asdict(diagnosis),
            "self_test": [asdict(test) for test in tests] if tests else None,
            "routed_calls": routed_calls(),
            "passed_calls": passed_calls(),
        }
        click.echo(json_module.dumps(report))
        return
    console = Console(highlight=False)
    console.print(f"[bold]device[/]: {diagnosis.device}")
    software = ", ".join(f"{k} {v}" for k, v in diagnosis.software.items())
    console.print(f"[bold]software[/]: {software}")
    console.print(f"[bold]database[/]: {diagnosis.database}")
    console.print(f"[bold]tuned configs usable here[/]: {diagnosis.usable} "
                  f"({diagnosis.faster} measured faster than vLLM)")
    if diagnosis.vllm_version is None:
        console.print("[bold]vLLM[/]: not installed")
    else:
        support = "supported" if diagnosis.vllm_supported else "NOT supported"
        console.print(f"[bold]vLLM[/]: {diagnosis.vllm_version} ({support})")
    verdict = "[green]yes[/]" if diagnosis.would_route else "[red]no[/]"
    console.print(f"[bold]plugin would route[/]: {verdict}")
    console.print(f"[bold]model runner here[/]: {diagnosis.runner}")
    for reason in diagnosis.reasons:
        console.print(f"  - {reason}")
    for test in tests:
        status = "[green]passed[/]" if test.ok else "[red]FAILED[/]"
        console.print(f"[bold]self-test, {test.runner}[/]: {status}: {test.detail}")
    if tests:
        console.print(f"[bold]routed calls in this process[/]: {routed_calls()}")
        passed = ", ".join(f"{n} {why}" for why, n in passed_calls().items()) or "none"
        console.print(f"[bold]handed to vLLM, by reason[/]: {passed}")


def _vllm_seams(path: str, *, as_json: bool) -> None:
    """``--vllm-seams [PATH]``: the seams table; exit 1 on a change or an unknown version."""
    from spectune.vllm.seams import SourceTree, check_tree, visible

    if path:
        try:
            tree = SourceTree.at(path)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--vllm-seams") from exc
    else:
        found = SourceTree.installed()
        if found is None:
            click.echo("vLLM is not installed here (give the path of a vLLM tree)")
            raise SystemExit(1)
        tree = found
    report = check_tree(tree)
    if as_json:
        click.echo(json_module.dumps(report.as_dict()))
        raise SystemExit(0 if report.ok else 1)
    version = visible(report.version or "(version unreadable)")
    where = visible(tree.package)
    if report.release is not None:
        click.echo(f"vLLM {version} at {where}: compared with the seams of vLLM "
                   f"{report.release}, as spectune registered them")
    else:
        click.echo(f"vLLM {version} at {where}: not a version spectune knows (known: "
                   f"{', '.join(report.known)})")
    header = ("STATUS", "HASH", "REGISTERED", "IMPL", "FAMILIES", "ROLE", "SEAM")
    rows = [header]
    for check in report.checks:
        signature = visible(check.found.get("signature", ""))
        joiner = "" if signature.startswith("(") else " "
        rows.append((
            check.status,
            check.found.get("hash") or "-",
            (check.expected or {}).get("hash") or "-",
            "yes" if check.implemented else "no",
            ",".join(check.seam.families),
            check.seam.role,
            f"{check.seam.name}{joiner}{signature}" if signature else check.seam.name,
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
        click.echo("  ".join([*cells, row[-1]]))
    implemented = sum(check.implemented for check in report.checks)
    click.echo(f"IMPL: whether spectune implements this release's semantics of the seam "
               f"({implemented} of {len(report.checks)}); a family routes only where all "
               "its seams are implemented and as registered")
    problems = report.problems()
    if not problems:
        click.echo(f"all {len(report.checks)} seams are as registered for vLLM "
                   f"{report.release}")
        return
    for line in problems:
        click.echo(f"FAILED: {visible(line)}")
    raise SystemExit(1)
