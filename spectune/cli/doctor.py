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
def doctor(as_json: bool, self_test: bool) -> None:
    """Device identity, database, vLLM version, and whether the plugin would route.

    Reads the same controls as the plugin (SPECTUNE_DISABLE, SPECTUNE_DB,
    SPECTUNE_FORCE, TRITON_INTERPRET) and the same databases, in the same order. It
    checks what holds for every engine; whether an engine uses speculative decoding, and
    which model runner, is decided when it starts (the plugin logs it then).
    """
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
    console.print(f"[bold]tuned configs usable here[/]: {diagnosis.usable}")
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
        console.print(f"[bold]handed to vLLM (not implemented)[/]: {passed}")
