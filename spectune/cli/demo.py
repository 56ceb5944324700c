"""``spectune demo``: the verification kernels beside the PyTorch reference, on one case."""

from __future__ import annotations

import time

import click
from rich.console import Console
from rich.table import Table

from spectune.space import DTYPES

__all__ = ["demo"]


@click.command()
@click.option("--batch", default=6, show_default=True, help="Requests.")
@click.option("--spec-len", "k", default=4, show_default=True, help="Drafts per request (k).")
@click.option("--vocab", default=32000, show_default=True, help="Vocabulary size.")
@click.option("--dtype", default="bfloat16", show_default=True, type=click.Choice(DTYPES))
@click.option("--seed", default=0, show_default=True)
def demo(batch: int, k: int, vocab: int, dtype: str, seed: int) -> None:
    """Verify one realistic batch of drafts with spectune's kernels and the reference.

    Half the requests are greedy, half random (rejection sampling with draft probs);
    the tokens each emits are printed side by side with the PyTorch reference.
    """
    from dataclasses import replace

    import torch

    from spectune.identity import detect_device, torch_device
    from spectune.kernels import get_family
    from spectune.kernels.rejection import decision_margins_agree
    from spectune.space import Problem

    console = Console()
    family = get_family("rejection_sample")
    identity = detect_device()
    problem = Problem(spec_len=k, batch=batch, vocab=vocab, dtype=dtype)
    device = torch_device(identity.backend)
    inputs = family.make_inputs(problem, seed=seed, device=device)
    greedy = torch.arange(batch, device=device) % 2 == 0

    inputs = replace(inputs, is_greedy=greedy)
    config = family.default_config(problem, identity.backend)

    console.print(f"[bold]device[/]: {identity.describe()}")
    console.print(f"[bold]problem[/]: B={batch} k={k} V={vocab} {dtype}, draft probs, "
                  "greedy and random requests")
    console.print(f"[bold]config[/]: {config}")
    start = time.perf_counter()
    out = family.launch(inputs, config).cpu()
    took = time.perf_counter() - start
    ref = family.reference(inputs)
    agree, why = decision_margins_agree(ref, out)

    table = Table(title="emitted tokens (-1: nothing emitted)")
    table.add_column("req", justify="right")
    table.add_column("mode")
    table.add_column("drafts")
    table.add_column("spectune (Triton)")
    table.add_column("reference (PyTorch)")
    table.add_column("same")
    drafts = inputs.draft_token_ids.cpu().reshape(batch, k)
    for req in range(batch):
        same = torch.equal(out[req], ref.tokens[req])
        table.add_row(
            str(req),
            "greedy" if bool(greedy[req]) else "random",
            " ".join(map(str, drafts[req].tolist())),
            " ".join(map(str, out[req].tolist())),
            " ".join(map(str, ref.tokens[req].tolist())),
            "[green]yes[/]" if same else "[yellow]near-tie[/]" if agree else "[red]NO[/]",
        )
    console.print(table)
    accepted = int(((out[:, :k] == drafts) & (out[:, :k] >= 0)).sum())
    console.print(f"accepted drafts: {accepted} of {batch * k}; kernels took {took:.2f} s "
                  f"({identity.backend})")
    if not agree:
        raise click.ClickException(f"spectune and the reference disagree: {why}")
    console.print("[green]spectune matches the reference.[/]")
