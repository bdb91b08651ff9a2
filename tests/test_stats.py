"""atp_jax.stats: BCa bootstrap intervals (the cases where BCa is undefined, coverage against known means) and the
expected best of j recorded values (against every draw enumerated)."""

import itertools
import math

import numpy as np
import pytest

from atp_jax.stats import MIN_VALUES, bootstrap_interval, expected_best_of, has_interval


def test_below_three_values_there_is_no_interval():
    assert MIN_VALUES == 3
    for values in ([3.0], [0.0, 1.0], [2.0, 2.0]):
        low, high = bootstrap_interval(values)
        assert math.isnan(low) and math.isnan(high) and not has_interval(low, high)


def test_zero_variance_is_the_point_itself():
    assert bootstrap_interval([0.25, 0.25, 0.25]) == (0.25, 0.25)
    assert has_interval(0.25, 0.25) and not has_interval(None, None)


def test_an_interval_brackets_the_mean_and_is_seeded():
    values = [0.1, 0.5, 0.2, 0.9, 0.4]
    low, high = bootstrap_interval(values, seed=1)
    assert low < np.mean(values) < high
    assert bootstrap_interval(values, seed=1) == (low, high)
    assert bootstrap_interval(values, seed=2) != (low, high)
    # A smaller coverage gives a narrower interval inside the wider one.
    inner = bootstrap_interval(values, level=0.5, seed=1)
    assert low <= inner[0] < inner[1] <= high


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="at least one value"):
        bootstrap_interval([])
    with pytest.raises(ValueError, match=r"level=95: give the coverage as a fraction in \(0, 1\)"):
        bootstrap_interval([1.0, 2.0, 3.0], level=95)


def test_large_sample_matches_the_normal_interval_of_a_proportion():
    values = [1.0] * 120 + [0.0] * 280  # p = 0.3, n = 400
    half = 1.959964 * math.sqrt(0.3 * 0.7 / 400)
    low, high = bootstrap_interval(values, resamples=4000)
    assert low == pytest.approx(0.3 - half, abs=0.006) and high == pytest.approx(0.3 + half, abs=0.006)


def test_coverage_at_twelve_questions():
    """Accuracy-like scores of 12 questions (Bernoulli, p = 0.3): over 300 seeded samples the 95% interval holds
    the true mean about 95% of the time (a percentile interval of the same samples: about 88%)."""
    rng = np.random.default_rng(123)
    samples = (rng.random((300, 12)) < 0.3).astype(float)
    covered = [low <= 0.3 <= high for low, high in (bootstrap_interval(s, seed=k) for k, s in enumerate(samples))]
    assert np.mean(covered) >= 0.93


@pytest.mark.parametrize("k,j", [(1, 1), (5, 1), (5, 2), (6, 3), (7, 7)])
def test_expected_best_of_enumerates_every_draw(k, j):
    values = np.random.default_rng(k * 10 + j).standard_normal(k)
    values[0] = values[-1]  # a tie
    brute = np.mean([max(values[list(c)]) for c in itertools.combinations(range(k), j)])
    assert expected_best_of(values, j) == pytest.approx(brute)
    with pytest.raises(ValueError, match="j must be in"):
        expected_best_of(values, k + 1)
