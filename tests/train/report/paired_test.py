"""Paired statistics of held-out outcomes: hand-computed cases, and intervals that cover a known
difference (and no difference) about 95% of the time over simulated comparisons."""

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
  assert abs(got["mean"] - (0.75 - 0.5)) < 1e-12
  # Identical seeds carry no seed part.
  same = paired.paired_difference(np.stack([a[1], a[1]]), b)
  assert same["se_seeds"] == 0.0


def _simulated(rng, delta, seeds=3, per_bin=200, bins=2, tau=0.01):
  """Two methods on the same problems: each problem has its own chance p (Beta(2, 2)); a run adds
  its seed's offset (sd `tau`) and flips a coin per problem; method a's chance is p + delta."""
  p = rng.beta(2, 2, size=bins * per_bin)
  names = np.repeat(np.arange(bins), per_bin)

  def runs(chance):
    offset = rng.normal(0.0, tau, size=(seeds, 1))
    return (rng.random((seeds, chance.size)) < np.clip(chance + offset, 0, 1)).astype(float)
  truth = float(np.mean(np.clip(p + delta, 0, 1) - p))  # the difference on these problems
  return paired.paired_difference(runs(p + delta), runs(p), names), truth


@pytest.mark.parametrize("tau", [0.0, 0.01])
def test_no_difference_is_covered_about_95_percent_of_the_time(tau):
  rng = np.random.default_rng(1)
  hits = [r["lo"] <= 0.0 <= r["hi"] for r, _ in (_simulated(rng, 0.0, tau=tau)
                                                 for _ in range(400))]
  assert 0.92 <= np.mean(hits) <= 0.985, np.mean(hits)  # 400 trials: sd of the share ~0.011


def test_a_known_difference_is_found_and_covered():
  rng = np.random.default_rng(2)
  results = [_simulated(rng, 0.1) for _ in range(200)]
  # The standard error here is about 0.02: a difference of about 0.09 is 4.5 of them.
  assert np.mean([r["se"] for r, _ in results]) < 0.022
  assert np.mean([r["lo"] > 0 for r, _ in results]) > 0.95   # found
  assert 0.92 <= np.mean([r["lo"] <= t <= r["hi"] for r, t in results]) <= 0.985  # covered


def test_bad_shapes_are_refused():
  with pytest.raises(ValueError, match="same problems"):
    paired.paired_difference(np.ones((2, 5)), np.ones((2, 6)))
  with pytest.raises(ValueError, match="same problems"):
    paired.paired_difference(np.ones((1, 0)), np.ones((1, 0)))
  with pytest.raises(ValueError, match="bins has shape"):
    paired.paired_difference(np.ones(5), np.ones(5), bins=np.zeros(4))
  with pytest.raises(ValueError, match="same problems"):
    paired.gain_sources(np.ones(3, bool), np.ones(3, bool), np.ones(4, bool))


def test_gain_sources_split_the_gained_problems_by_whether_the_answer_parsed_before():
  before = np.array([0, 0, 0, 1, 1, 0], bool)
  after = np.array([1, 1, 0, 1, 0, 1], bool)
  formatted = np.array([0, 1, 0, 1, 1, 0], bool)
  assert paired.gain_sources(before, after, formatted) == {
      "gained": 3, "format": 2, "skill": 1, "lost": 1, "format_share": 2 / 3}
  assert paired.gain_sources(before, before, formatted)["format_share"] is None
