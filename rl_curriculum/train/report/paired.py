"""Paired statistics of held-out outcomes: runs that answered the same problems compared problem
by problem, so each problem's difficulty cancels out of their difference.

  change = paired_difference(after, before, bins)     # one run against its warm start
  diff = paired_difference(outcomes_a, outcomes_b, bins)  # two methods, several seeds each
  sources = gain_sources(before, after, formatted_before)  # how much of a gain is format

Outcomes are per-problem 1 (right) / 0 (wrong), one row per run; held-out accuracy weighs every
bin equally (the runs' `eval/acc/<bin>` means averaged over bins).
"""

import math

import numpy as np

__all__ = ["t_quantile", "paired_difference", "gain_sources"]

# Two-sided 95% Student-t quantiles t_{0.975, df} for df = 1..30; beyond, the normal 1.96.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_quantile(df: float) -> float:
  """t_{0.975, df}, the two-sided 95% Student-t quantile, at df >= 1 (a fractional df rounds
  down, which widens the interval; beyond 30, 1.96)."""
  if df > len(_T975):
    return 1.96
  return _T975[max(int(math.floor(df)), 1) - 1]


def paired_difference(a, b, bins=None) -> dict:
  """Difference in held-out accuracy of two sets of runs that answered the same problems, with
  a 95% interval that uses the pairing.

  `a` f[Sa, n] and `b` f[Sb, n] hold per-problem outcomes (1 right, 0 wrong) of Sa and Sb runs
  (seeds) on the same n problems, in the same order; a single run may be given as f[n].
  `bins` int[n] names each problem's bin: accuracy is the mean over bins of each bin's mean, so
  every bin counts equally (None: one bin). The difference is D = mean_s acc(a_s) -
  mean_s acc(b_s) = sum_b w_b mean_{p in b} d_p with w_b = 1 / (number of bins) and
  d_p = mean_s a_sp - mean_s b_sp. Its variance has two parts:

    problems  sum_b w_b^2 var_{p in b}(d_p) / n_b: which problems the held-out set drew. Since
              both sides answered the same problems, a problem's difficulty cancels in d_p; this
              is the gain over comparing two independent intervals.
    seeds     tau_a^2 / Sa + tau_b^2 / Sb: how much a run's accuracy moves from seed to seed
              beyond the coin flips already in the problem part; tau^2 is the spread of the
              per-seed accuracies minus its expected coin-flip share (a moment estimate, at
              least 0). One seed: 0 (no spread known).

  The interval is D +- t sqrt(variance), t the 97.5% Student-t quantile at the Welch-Satterthwaite
  degrees of freedom of the parts (n - bins for the problems, S - 1 for each side's seeds): about
  1.96 when the problems dominate, wider when a few seeds' spread does.

  Returns:
    {"mean", "lo", "hi", "se", "se_problems", "se_seeds", "n_problems", "seeds": [Sa, Sb]}.

  Raises:
    ValueError: shapes that disagree or no problems.
  """
  a, b = np.atleast_2d(np.asarray(a, np.float64)), np.atleast_2d(np.asarray(b, np.float64))
  if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or a.shape[1] == 0 or not (
      a.shape[0] and b.shape[0]):
    raise ValueError(f"paired_difference needs outcomes [seeds, problems] on the same problems, "
                     f"got {a.shape} and {b.shape}")
  n = a.shape[1]
  bins = np.zeros(n, np.int64) if bins is None else np.asarray(bins)
  if bins.shape != (n,):
    raise ValueError(f"bins has shape {bins.shape}, not ({n},)")
  names = np.unique(bins)
  weight = 1.0 / len(names)
  d = a.mean(0) - b.mean(0)
  mean = sum(weight * d[bins == k].mean() for k in names)
  var_problems = 0.0
  for k in names:
    dk = d[bins == k]
    if dk.size > 1:
      var_problems += weight ** 2 * dk.var(ddof=1) / dk.size
  parts = [(var_problems, n - len(names))] + [
      (_seed_variance(x, bins, names, weight), x.shape[0] - 1) for x in (a, b)]
  var = sum(v for v, _ in parts)
  var_seeds = var - var_problems
  se = math.sqrt(var)
  # Welch-Satterthwaite degrees of freedom: near the problems' when they dominate, near the
  # seeds' (S - 1) when seed-to-seed spread does.
  df = var ** 2 / sum(v ** 2 / k for v, k in parts if v > 0 and k > 0) if var > 0 else math.inf
  half = t_quantile(df) * se
  return {"mean": float(mean), "lo": float(mean - half), "hi": float(mean + half), "se": se,
          "se_problems": math.sqrt(var_problems), "se_seeds": math.sqrt(var_seeds),
          "n_problems": int(n), "seeds": [int(a.shape[0]), int(b.shape[0])]}


def _seed_variance(x, bins, names, weight) -> float:
  """tau^2 / S of `paired_difference`: the variance of the mean over S seeds that seed-to-seed
  effects add (0 with one seed)."""
  s = x.shape[0]
  if s < 2:
    return 0.0
  acc = sum(weight * x[:, bins == k].mean(1) for k in names)     # per seed
  # A seed's accuracy moves by coin flips alone with variance sum_b w_b^2 mean_p q_p / n_b, q_p
  # the problem's Bernoulli variance, estimated unbiasedly from its S outcomes.
  flips = 0.0
  for k in names:
    xk = x[:, bins == k]
    q = xk.mean(0) * (1.0 - xk.mean(0)) * s / (s - 1)
    flips += weight ** 2 * q.mean() / xk.shape[1]
  tau2 = max(float(acc.var(ddof=1)) - flips, 0.0)
  return tau2 / s


def gain_sources(before, after, formatted_before) -> dict:
  """Where one run's held-out gain came from, problem by problem (bool[n] each: right before,
  right after, and whether the answer before parsed under the task's template).

  Returns {"gained": problems wrong before and right after, "format": those of them whose answer
  before did not parse, "skill": those whose answer before parsed and was wrong, "lost": problems
  right before and wrong after, "format_share": format / gained (None when nothing was
  gained)}. A gain that is mostly format means RL taught the model the answer format more than
  how to solve the problems."""
  before, after = np.asarray(before, bool), np.asarray(after, bool)
  formatted_before = np.asarray(formatted_before, bool)
  if not before.shape == after.shape == formatted_before.shape:
    raise ValueError(f"gain_sources needs outcomes of the same problems, got {before.shape}, "
                     f"{after.shape} and {formatted_before.shape}")
  gained = ~before & after
  fmt = int(np.sum(gained & ~formatted_before))
  total = int(np.sum(gained))
  return {"gained": total, "format": fmt, "skill": total - fmt,
          "lost": int(np.sum(before & ~after)),
          "format_share": fmt / total if total else None}
