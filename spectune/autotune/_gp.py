"""A small Gaussian-process surrogate and expected improvement, in numpy.

Matérn-5/2 kernel with one length scale per feature (ARD), Gaussian noise, fitted by
maximising the marginal likelihood with analytic gradients (L-BFGS-B), with weak
log-normal priors that keep the fit sane on a few dozen points. Targets are normalised
inside; callers pass log-times. Small on purpose: at a few hundred observations a fit
takes milliseconds, so the search can refit after every evaluation. Besides the
posterior mean and deviation it draws joint posterior samples (Thompson sampling).

Its linear algebra runs on one BLAS thread: on matrices of a few hundred rows, threads
only contend (``benchmarks/bench_proposal_cost.py``: with BLAS's own two threads on two
cores a proposal at 101-200 evaluations took 3.8 times as long), and the host a sweep
runs on has many cores and other work.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
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
    """

    def __init__(self, dims: int) -> None:
        self.dims = dims
        self.theta = np.r_[np.full(dims, _LS_PRIOR[0]), 0.0, _NOISE_PRIOR[0]]
        self._x: np.ndarray | None = None

    @_one_blas_thread
    def fit(self, x: np.ndarray, y: np.ndarray, *, optimize: bool = True) -> None:
        """Condition on ``(x, y)``; refit the hyperparameters when ``optimize``."""
        self._mean = float(y.mean())
        self._scale = float(y.std()) or 1.0
        yn = (y - self._mean) / self._scale
        if optimize and len(y) >= 2:
            diff2 = (x[:, None, :] - x[None, :, :]) ** 2
            bounds = [_LS_BOUNDS] * self.dims + [_SF_BOUNDS, _NOISE_BOUNDS]
            start = np.clip(self.theta, [b[0] for b in bounds], [b[1] for b in bounds])
            res = minimize(
                _neg_log_posterior,
                start,
                args=(diff2, yn),
                jac=True,
                method="L-BFGS-B",
                bounds=bounds,
                options={"maxiter": 50},
            )
            if np.all(np.isfinite(res.x)):
                self.theta = res.x
        self._ls = np.exp(self.theta[: self.dims])
        self._sf = float(np.exp(self.theta[self.dims]))
        noise = float(np.exp(self.theta[self.dims + 1]))
        k = self._sf * self._kernel(x, x) + (noise + _JITTER) * np.eye(len(x))
        self._chol = _cholesky(k)
        self._alpha = cho_solve((self._chol, True), yn)
        self._x = x

    @property
    def noise(self) -> float:
        """The fitted noise variance, as a share of the targets' variance."""
        return float(np.exp(self.theta[self.dims + 1]))

    @_one_blas_thread
    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation at ``x`` (in target units)."""
        mean, v = self._conditional(x)
        var = np.maximum(self._sf - (v * v).sum(0), 1e-12)
        return mean * self._scale + self._mean, np.sqrt(var) * self._scale

    @_one_blas_thread
    def sample(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One draw of the posterior at ``x`` (jointly; in target units)."""
        mean, v = self._conditional(x)
        cov = self._sf * self._kernel(x, x) - v.T @ v
        chol = _cholesky(cov + _JITTER * np.eye(len(x)))
        draw = mean + chol @ rng.standard_normal(len(x))
        return draw * self._scale + self._mean

    def _conditional(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Normalised posterior mean at ``x`` and ``L^-1 k(X, x)`` (for the covariance)."""
        assert self._x is not None, "fit first"
        ks = self._sf * self._kernel(x, self._x)
        v = solve_triangular(self._chol, ks.T, lower=True, check_finite=False)
        return ks @ self._alpha, v

    def _kernel(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        sa, sb = a / self._ls, b / self._ls
        r2 = (sa * sa).sum(1)[:, None] + (sb * sb).sum(1)[None, :] - 2.0 * sa @ sb.T
        r = np.sqrt(np.maximum(r2, 0.0))
        return (1.0 + _S5 * r + 5.0 * r * r / 3.0) * np.exp(-_S5 * r)


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
    theta: np.ndarray, diff2: np.ndarray, y: np.ndarray
) -> tuple[float, np.ndarray]:
    d = diff2.shape[2]
    ls2 = np.exp(2.0 * theta[:d])
    sf = np.exp(theta[d])
    noise = np.exp(theta[d + 1])
    scaled = diff2 / ls2
    r2 = scaled.sum(-1)
    r = np.sqrt(r2)
    e = np.exp(-_S5 * r)
    corr = (1.0 + _S5 * r + 5.0 * r2 / 3.0) * e
    n = len(y)
    k = sf * corr + (noise + _JITTER) * np.eye(n)
    try:
        chol = np.linalg.cholesky(k)
    except np.linalg.LinAlgError:
        return 1e10, np.zeros_like(theta)
    alpha = cho_solve((chol, True), y)
    k_inv = cho_solve((chol, True), np.eye(n))
    w = k_inv - np.outer(alpha, alpha)
    value = 0.5 * y @ alpha + np.log(np.diag(chol)).sum()
    grad = np.zeros_like(theta)
    # d corr / d log(ls_j) = (5/3) (1 + sqrt5 r) e^{-sqrt5 r} (diff_j / ls_j)^2
    common = sf * (5.0 / 3.0) * (1.0 + _S5 * r) * e
    grad[:d] = 0.5 * np.einsum("ij,ijk->k", w * common, scaled)
    grad[d] = 0.5 * np.sum(w * (sf * corr))
    grad[d + 1] = 0.5 * np.trace(w) * noise
    mu, sd = _LS_PRIOR
    value += 0.5 * np.sum(((theta[:d] - mu) / sd) ** 2)
    grad[:d] += (theta[:d] - mu) / sd**2
    mu, sd = _NOISE_PRIOR
    value += 0.5 * ((theta[d + 1] - mu) / sd) ** 2
    grad[d + 1] += (theta[d + 1] - mu) / sd**2
    return float(value), grad
