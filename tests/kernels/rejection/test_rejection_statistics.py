"""Random verification emits tokens distributed as the target (speculative sampling).

By the speculative-sampling theorem (Leviathan et al. 2023; Chen et al. 2023), whatever
the drafter's distribution q, the first token emitted for a request follows the target
distribution p exactly; the draft is accepted with probability sum_v min(p(v), q(v));
and, given that it was, the next position is the same experiment on its own p and q.
We check each claim with a chi-square (or exact binomial) test over many independent
requests, batched in one launch per experiment since each Triton program runs in the
interpreter. Three ways of drawing the randomness:

* ``dp``: draft probabilities given, drafts sampled from q, host coins and ``inv_q``;
* ``ngram``: no draft probabilities (the drafter proposes a fixed token: dp = 1);
* ``seeds``: draft probabilities given, each request its own seed, the kernels draw
  their coins and exponentials in-kernel (Philox).

Every RNG is seeded, so each p-value is a fixed number: a test passes or fails the same
way on every run. A negative control (:func:`test_statistic_has_power` and
:func:`test_broken_randomness_is_detected`) shows the same statistic rejects wrong
distributions at these sample sizes, so the tests can fail. ``pytest -s`` prints the
p-values.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from scipy import stats

from spectune.kernels import rejection_sample

pytestmark = pytest.mark.slow

#: Reject "the emitted tokens follow p" below this p-value.
ALPHA = 1e-3
#: A negative control must reject far more firmly than that.
POWER_ALPHA = 1e-6

# Position 1 and 2 target logits, and the drafter's (q != p, acceptance ~0.6-0.75).
_TARGET = {
    "dp": ([1.2, 0.4, -0.3, 0.9, -0.8, 0.1], [0.3, -0.6, 1.1, 0.0, 0.5, -0.2]),
    "ngram": ([0.5, 1.3, -0.4, 0.2, 0.0], [0.6, -0.2, 0.9, 0.1, -0.9]),
    "seeds": ([0.0, 0.8, -0.5, 0.3, 1.0, -1.0, 0.4, -0.2],),
}
_DRAFT = {
    "dp": ([0.2, 1.0, 0.1, -0.4, 0.3, -0.6], [0.9, -0.1, 0.4, 0.6, -0.7, 0.2]),
    "seeds": ([0.7, 0.0, 0.5, -0.6, 0.2, 0.4, -0.3, 0.1],),
}
#: The ngram drafter's fixed tokens, per position.
_NGRAM_DRAFTS = (1, 2)
# Requests per experiment: one program per draft row, ~10-20 ms each in the interpreter.
_BATCH = {"dp": 1500, "ngram": 1200, "seeds": 1200}


@dataclass(frozen=True)
class Experiment:
    """One launch: ``batch`` requests of the same ``k`` positions, and what came out."""

    mode: str
    p: torch.Tensor  # [k, V] float64 target probabilities, per position
    q: torch.Tensor | None  # [k, V] float64 draft probabilities (None: ngram)
    drafts: torch.Tensor  # [batch, k]
    tokens: torch.Tensor  # [batch, k + 1]

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]

    @property
    def vocab(self) -> int:
        return self.p.shape[1]

    def acceptance(self, pos: int) -> float:
        """Theoretical acceptance rate at ``pos``: sum_v min(p, q) (p(d) for ngram)."""
        if self.q is None:
            return float(self.p[pos, _NGRAM_DRAFTS[pos]])
        return float(torch.minimum(self.p[pos], self.q[pos]).sum())


def run_experiment(
    mode: str, *, batch: int, seed: int, inv_q_ones: bool = False
) -> Experiment:
    """``batch`` independent requests, all on the same target and drafter."""
    gen = torch.Generator().manual_seed(seed)
    target = torch.tensor(_TARGET[mode], dtype=torch.float32)
    k, vocab = target.shape
    p = torch.softmax(target.double(), dim=-1)
    logits = target.repeat(batch, 1)  # row b * k + j: request b, position j
    if mode == "ngram":
        q = None
        draft_probs = None
        drafts = torch.tensor(_NGRAM_DRAFTS[:k]).repeat(batch, 1)
    else:
        q = torch.softmax(torch.tensor(_DRAFT[mode], dtype=torch.float64), dim=-1)
        draft_probs = q.float().repeat(batch, 1)
        drafts = torch.stack(
            [torch.multinomial(q[j], batch, replacement=True, generator=gen) for j in range(k)],
            dim=1,
        )
    cu = torch.arange(1, batch + 1, dtype=torch.int32) * k
    random_inputs: dict[str, torch.Tensor]
    if mode == "seeds":
        random_inputs = {"seeds": torch.randint(0, 2**62, (batch,), generator=gen)}
    else:
        inv_q = 1.0 / torch.empty(batch, vocab).exponential_(generator=gen)
        random_inputs = {
            "uniform_probs": torch.rand(batch * k, dtype=torch.float64, generator=gen),
            "inv_q": torch.ones(batch, vocab) if inv_q_ones else inv_q,
        }
    tokens = rejection_sample(
        drafts.flatten().to(torch.int32), cu, logits,
        # Bonus ids must be in the vocabulary (the launcher checks); no statistic below
        # reads the bonus position.
        torch.full((batch,), vocab - 1, dtype=torch.int64),
        max_spec_len=k, draft_probs=draft_probs,
        is_greedy=torch.zeros(batch, dtype=torch.bool), **random_inputs,
    )
    return Experiment(mode=mode, p=p, q=q, drafts=drafts, tokens=tokens)


_EXPERIMENTS: dict[str, Experiment] = {}


def get_experiment(mode: str) -> Experiment:
    """The experiment of ``mode``, launched once per session (several tests read it)."""
    if mode not in _EXPERIMENTS:
        _EXPERIMENTS[mode] = run_experiment(mode, batch=_BATCH[mode], seed=2024)
    return _EXPERIMENTS[mode]


@pytest.fixture(params=["dp", "ngram", "seeds"])
def experiment(request: pytest.FixtureRequest) -> Experiment:
    return get_experiment(request.param)


@pytest.fixture(params=["dp", "ngram"])
def chained(request: pytest.FixtureRequest) -> Experiment:
    """An experiment with two positions per request."""
    return get_experiment(request.param)


def chi_square_pvalue(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square goodness of fit of ``tokens`` to ``probs`` (every cell expected >= 5)."""
    counts = torch.bincount(tokens.to(torch.int64), minlength=probs.numel()).double()
    assert counts.numel() == probs.numel(), f"tokens outside the vocabulary: {counts}"
    expected = probs.double() / probs.sum() * counts.sum()
    assert bool((expected >= 5).all()), f"too few samples for a chi-square: {expected}"
    return float(stats.chisquare(counts.numpy(), expected.numpy()).pvalue)


def _report(name: str, value: float) -> None:
    print(f"\n{name}: p-value {value:.3g}")


def test_first_token_follows_target(experiment: Experiment) -> None:
    first = experiment.tokens[:, 0]
    assert bool(((first >= 0) & (first < experiment.vocab)).all())
    pvalue = chi_square_pvalue(first, experiment.p[0])
    _report(f"[{experiment.mode}] first token ~ p (n={experiment.batch})", pvalue)
    assert pvalue > ALPHA


def test_acceptance_rate(experiment: Experiment) -> None:
    """Position 1 is accepted with probability sum_v min(p, q); position 2, given that,
    with its own sum_v min(p, q). Exact binomial tests."""
    tokens, drafts = experiment.tokens, experiment.drafts
    accepted = tokens[:, 1] != -1  # the chain went on past position 1
    assert torch.equal(tokens[accepted, 0], drafts[accepted, 0].to(torch.int32))
    n_accepted = int(accepted.sum())
    pvalue = stats.binomtest(n_accepted, experiment.batch, experiment.acceptance(0)).pvalue
    _report(
        f"[{experiment.mode}] acceptance at position 1: {n_accepted / experiment.batch:.4f} "
        f"vs {experiment.acceptance(0):.4f}", pvalue,
    )
    assert pvalue > ALPHA
    if experiment.p.shape[0] > 1:
        second = tokens[accepted, 2] != -1
        pvalue = stats.binomtest(int(second.sum()), n_accepted, experiment.acceptance(1)).pvalue
        _report(
            f"[{experiment.mode}] acceptance at position 2 given 1: "
            f"{float(second.double().mean()):.4f} vs {experiment.acceptance(1):.4f}", pvalue,
        )
        assert pvalue > ALPHA


def test_second_token_given_acceptance_follows_target(chained: Experiment) -> None:
    experiment = chained
    accepted = experiment.tokens[:, 1] != -1
    second = experiment.tokens[accepted, 1]
    assert bool(((second >= 0) & (second < experiment.vocab)).all())
    pvalue = chi_square_pvalue(second, experiment.p[1])
    _report(f"[{experiment.mode}] second token | first accepted ~ p2 (n={len(second)})", pvalue)
    assert pvalue > ALPHA


def test_statistic_has_power() -> None:
    """The same samples and statistic reject distributions close to p, but wrong."""
    dp = get_experiment("dp")
    first = dp.tokens[:, 0]
    assert dp.q is not None
    # p with 0.05 of probability moved from its most to its least likely token.
    perturbed = dp.p[0].clone()
    perturbed[perturbed.argmax()] -= 0.05
    perturbed[perturbed.argmin()] += 0.05
    # The drafter's own distribution: what emitting the drafts unverified would give.
    wrong = {"p perturbed by 0.05": perturbed, "q (drafts unverified)": dp.q[0]}

    ngram = get_experiment("ngram")
    # An ngram verifier that forgot to exclude the draft from the recovered distribution.
    t, p_ngram = _NGRAM_DRAFTS[0], ngram.p[0]
    not_excluded = (1 - p_ngram[t]) * p_ngram
    not_excluded[t] += p_ngram[t]
    for name, probs, tokens in [
        *((f"dp vs {n}", pr, first) for n, pr in wrong.items()),
        ("ngram vs draft not excluded", not_excluded, ngram.tokens[:, 0]),
    ]:
        pvalue = chi_square_pvalue(tokens, probs)
        _report(f"negative control, {name}", pvalue)
        assert pvalue < POWER_ALPHA, name


def test_broken_randomness_is_detected() -> None:
    """Negative control through the kernel: with ``inv_q`` all ones (the exponential race
    dropped), the recovered token is the residual's argmax, not a sample, and the
    first-token test rejects."""
    broken = run_experiment("dp", batch=300, seed=7, inv_q_ones=True)
    pvalue = chi_square_pvalue(broken.tokens[:, 0], broken.p[0])
    _report("negative control, dp with inv_q = 1", pvalue)
    assert pvalue < POWER_ALPHA
