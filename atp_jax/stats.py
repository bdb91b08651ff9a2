"""Bootstrap intervals of a mean: ``scipy.stats.bootstrap`` with bias-corrected and accelerated (BCa) ends.

Every interval the reports and figures show comes from here. A percentile interval of a mean under-covers
at the sample sizes these runs have (a dozen questions); BCa corrects the percentile ends for the bias and
skew of the bootstrap distribution. Where BCa is undefined the result says so instead of guessing:

* fewer than ``MIN_VALUES`` (3) values: ``(nan, nan)``, no interval — the acceleration is a jackknife over
  the values, and two values bound nothing beyond their own range;
* zero variance (every value equal): ``(mean, mean)`` — every resample has that mean, so the interval is
  the point (BCa itself divides by zero there).

A paired difference (an attack against its control on the same questions) is the interval of the mean
per-question difference: resampling questions keeps each question's two values together.

``expected_best_of`` is the other estimate the reports share: best-of-j random orders, exact in expectation
over k ≥ j recorded ones.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import scipy.stats

MIN_VALUES = 3


def bootstrap_interval(values, level: float = 0.95, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """The BCa bootstrap interval ``(low, high)`` of the mean of ``values`` ``[N]`` at coverage ``level``,
    from ``resamples`` resamples drawn with ``seed`` (the same values give the same interval).

    ``(nan, nan)`` when N < ``MIN_VALUES`` (or scipy finds the data degenerate); ``(mean, mean)`` when
    every value is equal. ``ValueError`` for no values or a level outside (0, 1).
    """
    values = np.asarray(values, dtype=np.float64).ravel()
    if values.size == 0:
        raise ValueError("bootstrap_interval needs at least one value")
    if not 0 < level < 1:
        raise ValueError(f"level={level}: give the coverage as a fraction in (0, 1), e.g. 0.95")
    if values.size < MIN_VALUES:
        return math.nan, math.nan
    if np.all(values == values[0]):
        return float(values[0]), float(values[0])
    with warnings.catch_warnings():
        # Degenerate resamples make BCa undefined: scipy warns and returns NaN, which is what we report.
        warnings.simplefilter("ignore", scipy.stats.DegenerateDataWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        result = scipy.stats.bootstrap(
            (values,),
            np.mean,
            confidence_level=level,
            n_resamples=resamples,
            method="BCa",
            rng=np.random.default_rng(seed),
        )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def has_interval(low: float | None, high: float | None) -> bool:
    """Whether ``(low, high)`` is an interval (not None, not the NaN of an undefined one)."""
    return low is not None and high is not None and not (math.isnan(low) or math.isnan(high))


def expected_best_of(values, j: int) -> float:
    """Exact expected maximum of ``j`` of ``values`` ``[k]`` drawn without replacement: the i-th smallest is the
    maximum of C(i-1, j-1) of the C(k, j) draws. Over k i.i.d. draws this is the U-statistic of the maximum of
    j draws, an unbiased estimate of best-of-j with less variance than one run of it."""
    v = np.sort(np.asarray(values, float))
    k = len(v)
    if not 1 <= j <= k:
        raise ValueError(f"j must be in 1..{k}, got {j}")
    weights = np.array([math.comb(i, j - 1) for i in range(k)], float) / math.comb(k, j)
    return float(weights @ v)
