"""A small Gaussian-process surrogate and expected improvement, in numpy.

Matérn-5/2 kernel with one length scale per feature (ARD), optionally plus Matérn-5/2
terms over subsets of the features (an additive kernel), Gaussian noise, fitted by
maximising the marginal likelihood with analytic gradients (L-BFGS-B), with weak
log-normal priors that keep the fit sane on a few dozen points. Targets are normalised
inside; callers pass log-times. Small on purpose: at a few hundred observations a fit
takes milliseconds, so the search can refit after every evaluation. Besides the
posterior mean and deviation it draws joint posterior samples (Thompson sampling).

Its linear algebra runs on one BLAS thread: on matrices of a few hundred rows, threads
only contend (measured by replay: with BLAS's own two threads on two cores a proposal at
101-200 evaluations took 3.8 times as long), and the host a sweep runs on has many cores
and other work.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
from scipy.linalg import cho_solve, solve_triangular
from scipy.optimize import minimize
from scipy.special import erfc
from threadpoolctl import ThreadpoolController

__all__ = ["TYPICAL_NOISE", "GaussianProcess", "expected_improvement"]

_S5 = np.sqrt(5.0)
_LS_PRIOR = (np.log(0.5), 1.0)  # mean, sd of log length scale (features in [0, 1])
#: The noise variance the fit expects (a share of the normalised targets' variance): the
#: mean of its prior.
TYPICAL_NOISE = 1e-2
_NOISE_PRIOR = (np.log(TYPICAL_NOISE), 2.0)  # mean, sd of log noise variance
_LS_BOUNDS = (np.log(0.02), np.log(10.0))
_SF_BOUNDS = (np.log(0.05), np.log(20.0))
_TERM_SF_START = -1.0  # a term's log signal variance before the first fit: a minor part
_NOISE_BOUNDS = (np.log(1e-5), np.log(1.0))
_JITTER = 1e-6

_F = TypeVar("_F", bound=Callable[..., Any])


@functools.cache
def _threadpools() -> ThreadpoolController:
    # Built once (it scans the loaded libraries, a few ms), after numpy and scipy load.
    return ThreadpoolController()


def _one_blas_thread(method: _F) -> _F:
    """Run ``method`` with every loaded BLAS limited to one thread (restored after)."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _threadpools().limit(limits=1, user_api="blas"):
            return method(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


class GaussianProcess:
    """GP regression on features in [0, 1].

    Args:
        dims: Number of features.
        terms: Column subsets of the features, each adding a Matérn-5/2 term (its own
            length scales and signal variance) over those columns alone to the kernel
            over all of them. A term shares what its columns do across the other
            features' values: where the full kernel's length scales are short (a rough
            space), an observation says little about configurations that differ from it
            in other parameters, and a term lets what, say, the block sizes do in one
            setting of the tiles inform every other setting.
    """

    def __init__(self, dims: int, *, terms: Sequence[Sequence[int]] = ()) -> None:
        self.dims = dims
        self.terms = [np.asarray(t, dtype=int) for t in terms]
        for t in self.terms:
            if not len(t) or t.min() < 0 or t.max() >= dims:
                raise ValueError(f"a term's columns must be among the {dims} features, got {t}")
        # The kernel's components: all features (a slice, so a view of the arrays: the
        # same memory gives the same rounding in numpy's reductions), then each term.
        columns: list[slice | np.ndarray] = [slice(None), *self.terms]
        # Each component's columns, the slice of its log length scales in ``theta`` and
        # the index of its log signal variance (the log noise variance is last).
        self._layout: list[tuple[slice | np.ndarray, slice, int]] = []
        at = 0
        for cols in columns:
            width = dims if isinstance(cols, slice) else len(cols)
            self._layout.append((cols, slice(at, at + width), at + width))
            at += width + 1
        start = [np.full(dims, _LS_PRIOR[0]), [0.0]]
        for t in self.terms:
            start += [np.full(len(t), _LS_PRIOR[0]), [_TERM_SF_START]]
        self.theta = np.concatenate([*start, [_NOISE_PRIOR[0]]])
        self._x: np.ndarray | None = None

    @_one_blas_thread
    def fit(self, x: np.ndarray, y: np.ndarray, *, optimize: bool = True) -> None:
        """Condition on ``(x, y)``; refit the hyperparameters when ``optimize``."""
        self._mean = float(y.mean())
        self._scale = float(y.std()) or 1.0
        yn = (y - self._mean) / self._scale
        if optimize and len(y) >= 2:
            diff2 = (x[:, None, :] - x[None, :, :]) ** 2
            bounds = []
            for _, ls, _ in self._layout:
                bounds += [_LS_BOUNDS] * (ls.stop - ls.start) + [_SF_BOUNDS]
            bounds.append(_NOISE_BOUNDS)
            start = np.clip(self.theta, [b[0] for b in bounds], [b[1] for b in bounds])
            # Each component's squared differences, taken once for the whole fit.
            parts = [(diff2[:, :, cols], ls, sf) for cols, ls, sf in self._layout]
            res = minimize(
                _neg_log_posterior,
                start,
                args=(parts, yn),
                jac=True,
                method="L-BFGS-B",
                bounds=bounds,
                options={"maxiter": 50},
            )
            if np.all(np.isfinite(res.x)):
                self.theta = res.x
        k = self._kernel(x, x) + (self.noise + _JITTER) * np.eye(len(x))
        self._chol = _cholesky(k)
        self._alpha = cho_solve((self._chol, True), yn)
        self._x = x

    @property
    def noise(self) -> float:
        """The fitted noise variance, as a share of the targets' variance."""
        return float(np.exp(self.theta[-1]))

    @_one_blas_thread
    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation at ``x`` (in target units)."""
        mean, v = self._conditional(x)
        prior = sum(np.exp(self.theta[sf]) for _, _, sf in self._layout)
        var = np.maximum(prior - (v * v).sum(0), 1e-12)
        return mean * self._scale + self._mean, np.sqrt(var) * self._scale

    @_one_blas_thread
    def sample(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One draw of the posterior at ``x`` (jointly; in target units)."""
        mean, v = self._conditional(x)
        cov = self._kernel(x, x) - v.T @ v
        chol = _cholesky(cov + _JITTER * np.eye(len(x)))
        draw = mean + chol @ rng.standard_normal(len(x))
        return draw * self._scale + self._mean

    def _conditional(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Normalised posterior mean at ``x`` and ``L^-1 k(X, x)`` (for the covariance)."""
        assert self._x is not None, "fit first"
        ks = self._kernel(x, self._x)
        v = solve_triangular(self._chol, ks.T, lower=True, check_finite=False)
        return ks @ self._alpha, v

    def _kernel(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The prior covariance of ``a`` and ``b``: every component, each with its
        signal variance."""
        total: np.ndarray | float = 0.0
        for cols, ls, sf in self._layout:
            scale = np.exp(self.theta[ls])
            sa, sb = a[:, cols] / scale, b[:, cols] / scale
            r2 = (sa * sa).sum(1)[:, None] + (sb * sb).sum(1)[None, :] - 2.0 * sa @ sb.T
            r = np.sqrt(np.maximum(r2, 0.0))
            total = total + np.exp(self.theta[sf]) * (
                (1.0 + _S5 * r + 5.0 * r * r / 3.0) * np.exp(-_S5 * r))
        return total  # type: ignore[return-value]


def expected_improvement(mean: np.ndarray, sd: np.ndarray, best: float) -> np.ndarray:
    """Expected improvement below ``best`` (minimisation)."""
    z = (best - mean) / sd
    cdf = 0.5 * erfc(-z / np.sqrt(2.0))
    pdf = np.exp(-0.5 * z * z) / np.sqrt(2.0 * np.pi)
    return (best - mean) * cdf + sd * pdf


def _cholesky(k: np.ndarray) -> np.ndarray:
    jitter = _JITTER
    for _ in range(6):
        try:
            return np.linalg.cholesky(k)
        except np.linalg.LinAlgError:
            k = k + jitter * np.eye(len(k))
            jitter *= 10.0
    return np.linalg.cholesky(k + jitter * np.eye(len(k)))


def _neg_log_posterior(
    theta: np.ndarray,
    components: list[tuple[np.ndarray, slice, int]],
    y: np.ndarray,
) -> tuple[float, np.ndarray]:
    """The negative log posterior of ``theta`` and its gradient. ``components``: each
    kernel component's squared feature differences (points x points x its columns), the
    slice of its log length scales in ``theta`` and the index of its log signal
    variance; the log noise variance is last."""
    n = len(y)
    noise = np.exp(theta[-1])
    k = (noise + _JITTER) * np.eye(n)
    parts = []
    for diff2, ls, sf_at in components:
        scaled = diff2 / np.exp(2.0 * theta[ls])
        r2 = scaled.sum(-1)
        r = np.sqrt(r2)
        e = np.exp(-_S5 * r)
        corr = (1.0 + _S5 * r + 5.0 * r2 / 3.0) * e
        sf = np.exp(theta[sf_at])
        k = k + sf * corr
        parts.append((ls, sf_at, scaled, r, e, corr, sf))
    try:
        chol = np.linalg.cholesky(k)
    except np.linalg.LinAlgError:
        return 1e10, np.zeros_like(theta)
    alpha = cho_solve((chol, True), y)
    k_inv = cho_solve((chol, True), np.eye(n))
    w = k_inv - np.outer(alpha, alpha)
    value = 0.5 * y @ alpha + np.log(np.diag(chol)).sum()
    grad = np.zeros_like(theta)
    mu, sd = _LS_PRIOR
    for ls, sf_at, scaled, r, e, corr, sf in parts:
        # d corr / d log(ls_j) = (5/3) (1 + sqrt5 r) e^{-sqrt5 r} (diff_j / ls_j)^2
        common = sf * (5.0 / 3.0) * (1.0 + _S5 * r) * e
        grad[ls] = 0.5 * np.einsum("ij,ijk->k", w * common, scaled)
        grad[sf_at] = 0.5 * np.sum(w * (sf * corr))
        value += 0.5 * np.sum(((theta[ls] - mu) / sd) ** 2)
        grad[ls] += (theta[ls] - mu) / sd**2
    grad[-1] = 0.5 * np.trace(w) * noise
    mu, sd = _NOISE_PRIOR
    value += 0.5 * ((theta[-1] - mu) / sd) ** 2
    grad[-1] += (theta[-1] - mu) / sd**2
    return float(value), grad
