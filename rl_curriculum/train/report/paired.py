"""Paired statistics of held-out outcomes: runs that answered the same problems compared problem
by problem, so each problem's difficulty cancels out of their difference.

  change = paired_difference(after, before, bins)     # one run against its warm start
  diff = paired_difference(outcomes_a, outcomes_b, bins)  # two methods, several seeds each
  check = bootstrap_difference(outcomes_a, outcomes_b, bins)  # the same D, resampled two ways
  sources = gain_sources(before, after, formatted_before)  # how much of a gain is format

Outcomes are per-problem 1 (right) / 0 (wrong), one row per run; held-out accuracy weighs every
bin equally (the runs' `eval/acc/<bin>` means averaged over bins).
"""

import math

import numpy as np

__all__ = ["t_quantile", "paired_difference", "bootstrap_difference", "gain_sources"]

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
              beyond the coin flips already in the problem part. tau^2 / S = m / S - f / S, m
              the variance of the S per-seed accuracies (ddof 1) and f its expected coin-flip
              share: an unbiased moment estimate, negative when the seeds agree more than coin
              flips alone would make them. It is not clipped at 0: the clip biases the variance
              upward and so hides how noisy the estimate is. One seed: 0 (no spread known).

  The variance V is the problem part plus the signed seed parts; where that total is <= 0 (seed
  parts negative enough to cancel the problem part), the problem part alone. The interval is
  D +- t sqrt(V), t the 97.5% Student-t quantile at the Welch-Satterthwaite degrees of freedom
  of the estimated terms of V, each a positive mean square with its own degrees of freedom:

    df = V^2 / (P^2 / (n - bins) + sum_sides [(m / S)^2 / (S - 1) + (f / S)^2 / (n - bins)])

  with P the problem part. The seed term's noise is that of m / S (S - 1 degrees of freedom)
  even where tau^2 is near 0, so a few seeds lower df in every regime: about 1.96 only when the
  problems dominate the spread of the per-seed accuracies (many seeds, or none to compare).

  Returns:
    {"mean", "lo", "hi", "se", "se_problems", "seed_variance", "se_seeds", "n_problems",
     "seeds": [Sa, Sb]}: "seed_variance" is the signed sum of the seed parts (negative when the
    seeds agree more than coin flips would make them), "se_seeds" = sqrt(max(seed_variance, 0)),
    for display only.

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
  seeds = [_seed_terms(x, bins, names, weight) for x in (a, b)]
  var_seeds = sum(spread - flips for spread, flips, _ in seeds)
  var = var_problems + var_seeds
  # Each estimated term of var with its degrees of freedom, for Welch-Satterthwaite.
  terms = [(var_problems, n - len(names))]
  if var > 0:
    terms += [t for spread, flips, s in seeds for t in ((spread, s - 1), (flips, n - len(names)))]
  else:
    var = var_problems
  se = math.sqrt(var)
  df = var ** 2 / sum(v ** 2 / k for v, k in terms if v > 0 and k > 0) if var > 0 else math.inf
  half = t_quantile(df) * se
  return {"mean": float(mean), "lo": float(mean - half), "hi": float(mean + half), "se": se,
          "se_problems": math.sqrt(var_problems), "seed_variance": float(var_seeds),
          "se_seeds": math.sqrt(max(var_seeds, 0.0)),
          "n_problems": int(n), "seeds": [int(a.shape[0]), int(b.shape[0])]}


def _seed_terms(x, bins, names, weight) -> tuple:
  """(m / S, f / S, S) of `paired_difference` for the S runs `x` f[S, n]: m the variance (ddof 1)
  of their accuracies, f its expected coin-flip share; their difference is tau^2 / S, what
  seed-to-seed effects add to the variance of the mean over seeds ((0, 0, 1) with one seed)."""
  s = x.shape[0]
  if s < 2:
    return 0.0, 0.0, s
  acc = sum(weight * x[:, bins == k].mean(1) for k in names)     # per seed
  # A seed's accuracy moves by coin flips alone with variance sum_b w_b^2 mean_p q_p / n_b, q_p
  # the problem's Bernoulli variance, estimated unbiasedly from its S outcomes.
  flips = 0.0
  for k in names:
    xk = x[:, bins == k]
    q = xk.mean(0) * (1.0 - xk.mean(0)) * s / (s - 1)
    flips += weight ** 2 * q.mean() / xk.shape[1]
  return float(acc.var(ddof=1)) / s, flips / s, s


def bootstrap_difference(a, b, bins=None, *, draws: int = 2000, seed: int = 0) -> dict:
  """The difference D of `paired_difference` (same `a`, `b`, `bins`) with a two-way bootstrap
  interval, seeds x problems: a check of the t interval, not the primary interval.

  Each draw resamples, with replacement and independently: the Sa rows (seeds) of `a`, the Sb
  rows of `b`, and within each bin b its n_b problems, the same problem indices for both sides
  (which keeps the pairing). With c_s the number of times seed s is drawn and k_p the number of
  times problem p is drawn, the draw's difference is

    D* = sum_b w_b / n_b sum_{p in b} k_p (sum_s c^a_s a_sp / Sa - sum_s c^b_s b_sp / Sb).

  The interval is the 2.5% and 97.5% percentiles of the draws. Each outcome's coin flip enters
  both the problem and the seed resampling, so the draws carry the coin-flip noise about twice:
  where coin flips are a large share of the variance the interval is conservative (wider than
  the t interval), which is what a check should be. Where seed-to-seed spread dominates it is
  not: resampling S seeds scales their spread by (S - 1) / S and the percentiles carry no t
  correction for knowing that spread from S seeds only, so with a few seeds it is the narrower.

  Returns:
    {"mean": D of the data, "lo", "hi": the percentiles, "se": standard deviation of the draws
     (ddof 1), "draws": draws}.

  Raises:
    ValueError: as `paired_difference`, or draws < 2.
  """
  a, b = np.atleast_2d(np.asarray(a, np.float64)), np.atleast_2d(np.asarray(b, np.float64))
  mean = paired_difference(a, b, bins)["mean"]   # also checks the shapes
  if draws < 2:
    raise ValueError(f"bootstrap_difference needs at least 2 draws, got {draws}")
  n = a.shape[1]
  bins = np.zeros(n, np.int64) if bins is None else np.asarray(bins)
  members = [np.flatnonzero(bins == k) for k in np.unique(bins)]
  rng = np.random.default_rng(seed)
  chunk = max(1, min(draws, 2 ** 20 // (n + a.shape[0] + b.shape[0])))  # bounded memory
  out = np.empty(draws)
  for start in range(0, draws, chunk):
    c = min(chunk, draws - start)
    diff = (_draw_counts(rng, a.shape[0], c) @ a / a.shape[0]
            - _draw_counts(rng, b.shape[0], c) @ b / b.shape[0])        # [c, n]
    weights = np.zeros((c, n))                    # k_p w_b / n_b of each drawn problem
    for idx in members:
      weights[:, idx] = _draw_counts(rng, idx.size, c) / (idx.size * len(members))
    out[start:start + c] = np.sum(weights * diff, axis=1)
  lo, hi = np.percentile(out, [2.5, 97.5])
  return {"mean": float(mean), "lo": float(lo), "hi": float(hi), "se": float(out.std(ddof=1)),
          "draws": int(draws)}


def _draw_counts(rng, k: int, c: int) -> np.ndarray:
  """int[c, k]: in each of c rows, how many times each of k items is drawn by k draws with
  replacement (a row sums to k)."""
  picks = rng.integers(k, size=(c, k)) + k * np.arange(c)[:, None]
  return np.bincount(picks.ravel(), minlength=c * k).reshape(c, k)


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
