"""Paired statistics of held-out outcomes: hand-computed cases, and intervals that cover a known
difference about 95% of the time over simulated comparisons, with and without seed effects."""

import math

import numpy as np
import pytest
from scipy import stats

from rl_curriculum.train.report import paired


def test_t_quantile_matches_scipy_and_rounds_a_fractional_df_down():
  for df in (1, 2, 5, 30):
    assert abs(paired.t_quantile(df) - stats.t.ppf(0.975, df)) < 1e-3
  assert paired.t_quantile(2.7) == paired.t_quantile(2)
  assert paired.t_quantile(31) == paired.t_quantile(math.inf) == 1.96


def test_one_run_against_another_on_one_bin_is_the_paired_t_interval():
  rng = np.random.default_rng(0)
  before = rng.random(300) < 0.4
  after = before | (rng.random(300) < 0.2)   # some problems gained
  after[:10] = False                        # and a few lost
  got = paired.paired_difference(after, before)
  d = after.astype(float) - before
  se = d.std(ddof=1) / math.sqrt(d.size)
  assert abs(got["mean"] - d.mean()) < 1e-12 and abs(got["se"] - se) < 1e-12
  assert got["se_seeds"] == 0.0 and got["seeds"] == [1, 1] and got["n_problems"] == 300
  assert abs(got["hi"] - got["mean"] - 1.96 * se) < 1e-12  # df = 299: the normal quantile
  # The same outcomes compared unpaired: the pairing is what makes the interval narrow.
  unpaired = math.sqrt(after.var(ddof=1) / 300 + before.var(ddof=1) / 300)
  assert got["se"] < 0.8 * unpaired


def test_bins_count_equally_and_their_variances_add_with_weight_squared():
  a = np.array([1, 1, 0, 1, 1, 0, 0, 1, 1, 1], float)
  b = np.array([0, 1, 0, 0, 1, 0, 1, 1, 1, 1], float)
  bins = np.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 1])
  got = paired.paired_difference(a, b, bins)
  d0, d1 = (a - b)[:4], (a - b)[4:]
  assert abs(got["mean"] - (d0.mean() + d1.mean()) / 2) < 1e-12
  var = 0.25 * (d0.var(ddof=1) / 4 + d1.var(ddof=1) / 6)
  assert abs(got["se"] - math.sqrt(var)) < 1e-12
  # Degrees of freedom n - bins = 8.
  assert abs(got["hi"] - got["mean"] - stats.t.ppf(0.975, 8) * math.sqrt(var)) < 1e-3


def test_seed_spread_beyond_coin_flips_widens_the_interval():
  """Two seeds of a that differ on every problem of one half (accuracy 1.0 and 0.5): the seed
  part is their accuracies' variance minus the coin-flip share, divided by 2."""
  n = 40
  a = np.ones((2, n))
  a[1, : n // 2] = 0.0
  b = np.full((1, n), 0.5)
  got = paired.paired_difference(a, b)
  acc = a.mean(1)
  q = a.mean(0) * (1 - a.mean(0)) * 2  # per-problem Bernoulli variance, unbiased from 2 outcomes
  tau2 = acc.var(ddof=1) - q.mean() / n
  assert tau2 > 0 and abs(got["se_seeds"] - math.sqrt(tau2 / 2)) < 1e-12
  assert abs(got["seed_variance"] - tau2 / 2) < 1e-12
  assert abs(got["mean"] - (0.75 - 0.5)) < 1e-12
  # Welch-Satterthwaite over the estimated terms: the problems (n - 1), the spread of a's two
  # accuracies (1 degree of freedom) and the coin-flip share subtracted from it (n - 1).
  var_problems = (a.mean(0) - 0.5).var(ddof=1) / n
  var = var_problems + tau2 / 2
  df = var ** 2 / (var_problems ** 2 / (n - 1) + (acc.var(ddof=1) / 2) ** 2 / 1
                   + (q.mean() / n / 2) ** 2 / (n - 1))
  assert abs(got["se"] - math.sqrt(var)) < 1e-12 and 0.9 < df < 1   # counted as 1
  assert abs(got["hi"] - got["mean"] - 12.706 * math.sqrt(var)) < 1e-12
  # Identical seeds carry no seed part.
  same = paired.paired_difference(np.stack([a[1], a[1]]), b)
  assert same["se_seeds"] == 0.0 and same["seed_variance"] == 0.0


def test_a_negative_seed_part_is_kept_and_the_problem_part_stands_in_for_a_total_below_zero():
  """Two seeds of a that disagree on every problem yet score the same (0.5 each): their
  accuracies agree more than coin flips would make them, so the seed part is negative,
  -(coin-flip share) / 2; b, one run, is right on one problem only."""
  n = 20
  a = np.stack([np.arange(n) % 2, 1 - np.arange(n) % 2]).astype(float)
  b = np.zeros(n)
  b[0] = 1.0
  got = paired.paired_difference(a, b)
  flips = 0.5 / n        # per-problem Bernoulli variance 0.5 (two outcomes 1, 0), over n
  var_problems = (0.5 - b).var(ddof=1) / n
  assert abs(got["seed_variance"] + flips / 2) < 1e-15 and got["se_seeds"] == 0.0
  assert var_problems - flips / 2 < 0   # the total is negative: the problem part alone
  assert got["se"] == got["se_problems"] and abs(got["se"] - math.sqrt(var_problems)) < 1e-15
  assert abs(got["hi"] - got["mean"] - 2.093 * got["se"]) < 1e-12   # t_{0.975, n - 1 = 19}


# Simulated comparisons with a known difference. Every problem has a base chance p_p
# (uniform on [0.3, 0.7]) and a method effect delta + e_p (e_p uniform on [-0.1, 0.1]); a run
# (seed) s of either method adds its own shift u_s (normal, sd sigma, cut symmetrically at 2.5
# sigma) and answers problem p right with chance p_p + side (delta + e_p) / 2 + u_s, side +1 for
# a and -1 for b: always inside [0.025, 0.975], so no clipping. Every term but delta has mean 0
# and the problems and seeds are drawn afresh in each experiment, so the expectation of D is
# exactly DELTA.
DELTA = 0.05
PROBLEM_BINS = np.repeat([0, 1], 150)   # 300 problems in two bins


def _experiments(rng, sigma, experiments, seeds=5):
  """Outcomes (a, b), each f[experiments, seeds, 300], of `experiments` simulated comparisons."""
  shape = (experiments, 1, PROBLEM_BINS.size)
  base, effect = rng.uniform(0.3, 0.7, shape), DELTA + rng.uniform(-0.1, 0.1, shape)

  def side(sign):
    shift = np.clip(rng.normal(0.0, sigma, (experiments, seeds, 1)), -2.5 * sigma, 2.5 * sigma)
    chance = base + sign * effect / 2 + shift
    assert 0.0 <= chance.min() and chance.max() <= 1.0
    return (rng.random(chance.shape) < chance).astype(float)
  return side(1), side(-1)


# (i) no seed effect; (ii) seed effect as large as the problem part (2 sigma^2 / 5 = 3.6e-4
# against about 3.2e-4); (iii) seed effect dominant (2 sigma^2 / 5 = 2.6e-3, 8 times).
REGIMES = {"no_seed_effect": 0.0, "seeds_as_large_as_problems": 0.03, "seeds_dominate": 0.08}


@pytest.mark.parametrize("sigma", REGIMES.values(), ids=REGIMES.keys())
def test_the_interval_covers_the_true_difference_95_percent_of_the_time(sigma):
  a, b = _experiments(np.random.default_rng(5), sigma, 1000)
  results = [paired.paired_difference(x, y, PROBLEM_BINS) for x, y in zip(a, b)]
  covered = np.mean([r["lo"] <= DELTA <= r["hi"] for r in results])
  # 1000 experiments: the binomial sd of the coverage is sqrt(0.95 * 0.05 / 1000) = 0.0069, so
  # 0.95 +- 0.03 is about 4.3 sd. Measured with this seed: 0.971, 0.965, 0.965.
  assert 0.92 <= covered <= 0.98, covered


def test_without_seed_effects_the_seed_part_scatters_around_zero():
  """The moment estimate of the seed part is unbiased: with no seed effect it is negative about
  as often as positive and its mean is 0 within noise; clipped at 0, its mean would be well above
  0."""
  a, b = _experiments(np.random.default_rng(6), 0.0, 1000)
  results = [paired.paired_difference(x, y, PROBLEM_BINS) for x, y in zip(a, b)]
  seed_var = np.array([r["seed_variance"] for r in results])
  assert 0.4 <= np.mean(seed_var < 0) <= 0.7        # measured 0.59
  assert abs(seed_var.mean()) < 3 * seed_var.std() / math.sqrt(seed_var.size)
  clipped = np.maximum(seed_var, 0.0)
  assert clipped.mean() > 10 * clipped.std() / math.sqrt(clipped.size)
  assert all(r["se_seeds"] == math.sqrt(max(v, 0.0)) for r, v in zip(results, seed_var))
  # The difference of 0.05 against a standard error of about 0.018 is found in most experiments
  # (measured 0.64): five seeds cannot rule out a seed effect, so t is 2.26 to 2.78, not 1.96.
  assert np.mean([r["lo"] > 0 for r in results]) > 0.55


def test_the_two_way_bootstrap_covers_at_least_nominally_when_seeds_matter():
  a, b = _experiments(np.random.default_rng(7), REGIMES["seeds_as_large_as_problems"], 200)
  results = [paired.bootstrap_difference(x, y, PROBLEM_BINS, draws=500, seed=i)
             for i, (x, y) in enumerate(zip(a, b))]
  # Conservative by construction (coin flips counted twice): measured 0.98; 200 experiments give
  # the coverage a binomial sd of 0.015 at 0.95.
  assert np.mean([r["lo"] <= DELTA <= r["hi"] for r in results]) >= 0.93
  assert all(r["draws"] == 500 and r["lo"] <= r["mean"] <= r["hi"] for r in results)


def test_bootstrap_of_identical_seeds_is_the_problems_bootstrap():
  """All seeds of each side identical: resampling seeds changes nothing and the draws are the
  bootstrap of mean_p d_p over problems, whose standard deviation is sd(d) / sqrt(n) (ddof 0)
  up to the draws' noise (about 1 / sqrt(2 draws) = 1.6% relative for 2000)."""
  rng = np.random.default_rng(8)
  n = 400
  a_run, b_run = (rng.random(n) < 0.6).astype(float), (rng.random(n) < 0.5).astype(float)
  got = paired.bootstrap_difference(np.stack([a_run] * 4), np.stack([b_run] * 3), seed=3)
  d = a_run - b_run
  assert got["mean"] == pytest.approx(d.mean(), abs=1e-12) and got["draws"] == 2000
  assert got["se"] == pytest.approx(d.std() / math.sqrt(n), rel=0.06)
  assert got["hi"] - got["lo"] == pytest.approx(2 * 1.96 * d.std() / math.sqrt(n), rel=0.1)
  assert got == paired.bootstrap_difference(np.stack([a_run] * 4), np.stack([b_run] * 3), seed=3)
  # The same outcome difference on every problem: every draw is D itself.
  flat = paired.bootstrap_difference(np.ones((2, 50)), np.zeros((3, 50)), np.repeat([0, 1], 25))
  assert [flat[k] for k in ("mean", "lo", "hi", "se")] == pytest.approx([1, 1, 1, 0], abs=1e-12)


def test_bad_shapes_are_refused():
  with pytest.raises(ValueError, match="same problems"):
    paired.paired_difference(np.ones((2, 5)), np.ones((2, 6)))
  with pytest.raises(ValueError, match="same problems"):
    paired.paired_difference(np.ones((1, 0)), np.ones((1, 0)))
  with pytest.raises(ValueError, match="bins has shape"):
    paired.paired_difference(np.ones(5), np.ones(5), bins=np.zeros(4))
  with pytest.raises(ValueError, match="same problems"):
    paired.gain_sources(np.ones(3, bool), np.ones(3, bool), np.ones(4, bool))
  with pytest.raises(ValueError, match="same problems"):
    paired.bootstrap_difference(np.ones((2, 5)), np.ones((2, 6)))
  with pytest.raises(ValueError, match="at least 2 draws"):
    paired.bootstrap_difference(np.ones(5), np.ones(5), draws=1)


def test_gain_sources_split_the_gained_problems_by_whether_the_answer_parsed_before():
  before = np.array([0, 0, 0, 1, 1, 0], bool)
  after = np.array([1, 1, 0, 1, 0, 1], bool)
  formatted = np.array([0, 1, 0, 1, 1, 0], bool)
  assert paired.gain_sources(before, after, formatted) == {
      "gained": 3, "format": 2, "skill": 1, "lost": 1, "format_share": 2 / 3}
  assert paired.gain_sources(before, before, formatted)["format_share"] is None
