"""A simulated learner on which curricula can be compared in seconds.

The pool has K difficulty bins (arms) of `prompts_per_bin` prompts each. The learner has one skill
s_k per bin; prompt i in bin k = c_i succeeds with probability

  p_i = sigmoid(a (s_k + o_i - d_k)),   d_k = k * bin_spacing,

with a fixed per-prompt offset o_i ~ N(0, prompt_offset_std^2) drawn per seed. One step:

  1. the curriculum selects P prompts;
  2. each prompt gets G Bernoulli(p_i) outcomes; reward = correctness (0/1);
  3. advantages are RLOO (`rl_curriculum.rl.advantages.rloo`);
  4. the curriculum is updated with the Feedback;
  5. skills move with the policy-gradient signal of the batch. Bin k's signal is
       g_k = (1/P) sum_{p: c_p = k} mean_g |A[p, g]|,
     the share of the batch's |advantage| mass that falls in bin k (all-right and all-wrong groups
     carry none), and
       s_j <- s_j + eta sum_k transfer^|j - k| g_k,
     so practice on a bin also helps its neighbours, geometrically less with distance.

Unlearnable bins never move skills and have success fixed at 0 ("zero") or a coin flip with
probability `noise_success` per completion ("noise": a source of advantage that teaches nothing).

A run is one jitted `lax.scan` over steps (`simulate`); `simulate_seeds` vmaps it over seeds. The
gym touches a curriculum only through `init`, `select` and `update`, so any `Curriculum` works,
prompt-level ones included.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rl_curriculum.curriculum.base import Curriculum, PromptPool
from rl_curriculum.rl.advantages import rloo
from rl_curriculum.types import Feedback

__all__ = ["GymConfig", "SETTINGS", "make_pool", "learnable_mask", "success_probs", "skill_update",
           "gym_step", "simulate", "simulate_seeds", "steps_to_target", "late_mass"]

UNLEARNABLE_MODES = ("zero", "noise")


class GymConfig(NamedTuple):
  """Static description of a simulated learner; hashable, so it is a static jit argument.

  The defaults give starting bin successes of about 0.67, 0.34, 0.10, 0.03, 0.005 for bins 0-4 (a
  ladder like the measured SmolLM2-135M arithmetic one: 0.6, 0.2, 0.2, 0.06, 0.04), and a learner
  that, trained uniformly, is still improving on the upper bins after 300 steps.
  """
  num_bins: int = 6                  # K difficulty bins (arms)
  prompts_per_bin: int = 64          # pool size N = K * prompts_per_bin
  batch_size: int = 64               # P prompts per step
  group_size: int = 8                # G completions per prompt
  steps: int = 300                   # steps per run
  slope: float = 1.5                 # a: logit per unit of (skill - difficulty)
  bin_spacing: float = 1.0           # d_k = k * bin_spacing, in skill units
  initial_skill: float = 0.5         # s_k at step 0, every bin
  learning_rate: float = 0.1         # eta: skill units per unit of signal
  transfer: float = 0.5              # signal share reaching a bin at distance 1 (geometric)
  prompt_offset_std: float = 0.3     # std of the per-prompt offset o_i, skill units
  unlearnable: tuple = ()            # bins whose success never changes
  unlearnable_mode: str = "zero"     # "zero": success 0; "noise": Bernoulli(noise_success)
  noise_success: float = 0.5         # success probability of a "noise" bin
  target: float = 0.6                # mean success over learnable bins that counts as reached


SETTINGS = {
    # Six bins, the hardest cannot be learned (success 0): a curriculum should stop spending
    # batch slots on it.
    "ladder6_unlearnable_top": GymConfig(unlearnable=(5,)),
    # The same ladder with every bin learnable.
    "ladder6": GymConfig(),
    # The top bin's outcomes are coin flips: |advantage| is high there but teaches nothing.
    "ladder6_noisy_top": GymConfig(unlearnable=(5,), unlearnable_mode="noise"),
}


def _check_config(config: GymConfig) -> None:
  if config.unlearnable_mode not in UNLEARNABLE_MODES:
    raise ValueError(f"unlearnable_mode must be one of {list(UNLEARNABLE_MODES)}, got "
                     f"{config.unlearnable_mode!r}")
  if any(not 0 <= k < config.num_bins for k in config.unlearnable):
    raise ValueError(f"unlearnable bins must lie in [0, {config.num_bins}), got "
                     f"{config.unlearnable}")
  if len(set(config.unlearnable)) == config.num_bins:
    raise ValueError("at least one bin must be learnable")
  if config.group_size < 2:
    raise ValueError(f"group_size must be >= 2 for RLOO advantages, got {config.group_size}")


def make_pool(config: GymConfig) -> PromptPool:
  """PromptPool of K * prompts_per_bin prompts; prompt i is in bin i // prompts_per_bin."""
  arms = np.repeat(np.arange(config.num_bins, dtype=np.int32), config.prompts_per_bin)
  return PromptPool.from_arms(arms, num_arms=config.num_bins,
                              difficulty=arms.astype(np.float32) * config.bin_spacing)


def learnable_mask(config: GymConfig) -> np.ndarray:
  """bool[K], False on unlearnable bins."""
  mask = np.ones((config.num_bins,), bool)
  mask[list(config.unlearnable)] = False
  return mask


def success_probs(skills: jax.Array, offsets: jax.Array, config: GymConfig) -> jax.Array:
  """f32[N] success probability of every prompt of the pool.

  Args:
    skills: f32[K] skill per bin.
    offsets: f32[N] per-prompt offset o_i.
    config: the gym.
  """
  pool = make_pool(config)
  arms = pool.arms
  p = jax.nn.sigmoid(config.slope * (skills[arms] + offsets - pool.difficulty))
  fixed = 0.0 if config.unlearnable_mode == "zero" else config.noise_success
  return jnp.where(jnp.asarray(learnable_mask(config))[arms], p, fixed)


def _bin_success(p: jax.Array, config: GymConfig) -> jax.Array:
  """f32[K] mean success probability over each bin's prompts."""
  return p.reshape(config.num_bins, config.prompts_per_bin).mean(axis=1)


def skill_update(skills: jax.Array, arms: jax.Array, advantages: jax.Array,
                 config: GymConfig) -> jax.Array:
  """Moves skills with the batch's policy-gradient signal (module docstring, step 5).

  g_k = (1/P) sum_{p: arms[p] = k} mean_g |A[p, g]|  (0 for unlearnable k),
  s_j <- s_j + eta sum_k transfer^|j - k| g_k       (unchanged for unlearnable j).

  Args:
    skills: f32[K]; arms: i32[P] bin of each prompt; advantages: f32[P, G]; config: the gym.

  Returns:
    f32[K] new skills.
  """
  num_bins, p_slots = config.num_bins, arms.shape[0]
  learnable = jnp.asarray(learnable_mask(config))
  group_signal = jnp.mean(jnp.abs(advantages), axis=1)                             # f32[P]
  signal = jax.ops.segment_sum(group_signal, arms, num_segments=num_bins) / p_slots  # f32[K]
  signal = jnp.where(learnable, signal, 0.0)
  dist = jnp.abs(jnp.arange(num_bins)[:, None] - jnp.arange(num_bins)[None, :])
  transfer = jnp.asarray(config.transfer, jnp.float32) ** dist.astype(jnp.float32)  # f32[K, K]
  delta = config.learning_rate * jnp.sum(transfer * signal[None, :], axis=1)
  return skills + jnp.where(learnable, delta, 0.0)


class GymCarry(NamedTuple):
  """Scan carry of `simulate`."""
  skills: jax.Array     # f32[K] learner skill per bin
  cur_state: object     # the curriculum's state pytree


def gym_step(curriculum: Curriculum, config: GymConfig, offsets: jax.Array, carry: GymCarry,
             key: jax.Array) -> tuple[GymCarry, dict]:
  """One simulated RL step (module docstring, steps 1-5).

  Args:
    curriculum: any Curriculum built for `make_pool(config)` with batch size P.
    config: the gym.
    offsets: f32[N] per-prompt offsets of this seed.
    carry: (skills f32[K], curriculum state).
    key: this step's PRNG key.

  Returns:
    (new carry, trace dict): arm_freq f32[K] (share of the P slots per bin), success f32[K] (bin
    success after the step), mean_success f32[] (over learnable bins), signal_frac f32[] (share of
    slots whose group has non-zero advantage), metrics (the curriculum's metrics dict).
  """
  k_sel, k_out = jax.random.split(key)
  num_bins, p_slots, g = config.num_bins, config.batch_size, config.group_size
  learnable = jnp.asarray(learnable_mask(config))

  selection, cur_state = curriculum.select(carry.cur_state, k_sel)
  probs = success_probs(carry.skills, offsets, config)
  pool_arms = make_pool(config).arms
  # Bins of the chosen prompts come from the pool, not from what the curriculum reports.
  arms = pool_arms[selection.prompt_ids]
  correct = jax.random.uniform(k_out, (p_slots, g)) < probs[selection.prompt_ids][:, None]
  rewards = correct.astype(jnp.float32)
  advantages = rloo(rewards)
  feedback = Feedback(prompt_ids=selection.prompt_ids, arms=arms, rewards=rewards,
                      correct=correct, advantages=advantages)
  cur_state, metrics = curriculum.update(cur_state, feedback)

  skills = skill_update(carry.skills, arms, advantages, config)

  success = _bin_success(success_probs(skills, offsets, config), config)
  mean_success = jnp.sum(jnp.where(learnable, success, 0.0)) / jnp.sum(learnable)
  trace = {
      "arm_freq": jax.ops.segment_sum(jnp.ones((p_slots,), jnp.float32), arms,
                                      num_segments=num_bins) / p_slots,
      "success": success,
      "mean_success": mean_success,
      "signal_frac": jnp.mean(jnp.any(advantages != 0, axis=1).astype(jnp.float32)),
      "metrics": metrics,
  }
  return GymCarry(skills=skills, cur_state=cur_state), trace


@functools.partial(jax.jit, static_argnums=(0, 1))
def simulate(curriculum: Curriculum, config: GymConfig, key: jax.Array) -> dict:
  """One whole run as a jitted `lax.scan`; step t uses `fold_in(key, t)`.

  Args:
    curriculum: a Curriculum built for `make_pool(config)` with batch size config.batch_size.
    config: the gym (static).
    key: the seed's PRNG key.

  Returns:
    dict of per-step traces, each with a leading axis of config.steps (see `gym_step`).

  Raises:
    ValueError: on a bad config.
  """
  _check_config(config)
  k_offsets, k_init, k_steps = jax.random.split(key, 3)
  pool = make_pool(config)
  offsets = config.prompt_offset_std * jax.random.normal(k_offsets, (pool.size,))
  carry = GymCarry(skills=jnp.full((config.num_bins,), config.initial_skill, jnp.float32),
                   cur_state=curriculum.init(pool, k_init))
  keys = jax.vmap(lambda t: jax.random.fold_in(k_steps, t))(jnp.arange(config.steps))
  step = functools.partial(gym_step, curriculum, config, offsets)
  _, traces = jax.lax.scan(step, carry, keys)
  return traces


@functools.partial(jax.jit, static_argnums=(0, 1))
def simulate_seeds(curriculum: Curriculum, config: GymConfig, keys: jax.Array) -> dict:
  """`simulate` vmapped over a batch of seed keys; every trace gains a leading seed axis S."""
  return jax.vmap(lambda k: simulate(curriculum, config, k))(keys)


def steps_to_target(mean_success: np.ndarray, target: float) -> np.ndarray:
  """Per run, the first step (1-based) whose mean success >= target; inf if never.

  Args:
    mean_success: f[S, steps].
  """
  mean_success = np.asarray(mean_success)
  hit = mean_success >= target
  first = np.argmax(hit, axis=-1).astype(np.float64) + 1.0
  return np.where(hit.any(axis=-1), first, np.inf)


def late_mass(arm_freq: np.ndarray, bins, fraction: float = 0.25) -> np.ndarray:
  """Per run, the share of batch slots on `bins` over the last `fraction` of steps.

  Args:
    arm_freq: f[S, steps, K] selection frequencies.
    bins: bins to sum over.
    fraction: tail of the run to average over, in (0, 1].
  """
  arm_freq = np.asarray(arm_freq)
  steps = arm_freq.shape[-2]
  start = steps - max(1, int(round(fraction * steps)))
  return arm_freq[..., start:, list(bins)].sum(axis=-1).mean(axis=-1)
