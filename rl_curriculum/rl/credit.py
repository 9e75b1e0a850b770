"""Rows with turns: where each turn's tokens lie, rewards on turns, and turn-level credit.

A row of a multi-turn episode holds the policy's turns with the environment's observations between
them: mask 1 on the tokens the policy drew, 0 on observation ids and padding. A turn is a maximal
run of drawn positions, turn k the k-th run of its row (k = 0, 1, ...); a single-turn completion
is a row of one turn. Everything here is read from the mask alone, so it holds for any layout of
turns and observations, and the row of one turn is the special case of each function.

  index = turn_index(mask)                        # i32[B, T] k on turn k's tokens, -1 elsewhere
  r_tok = on_turn_ends(turn_rewards, mask)        # turn k's reward on its last drawn token
  a_tok = on_turn_tokens(turn_advantages, mask)   # turn k's advantage on each of its tokens
  g = returns_to_go(turn_rewards, discount)       # G_k = sum_{j >= k} discount^(j - k) r_j
  a = turn_advantages(turn_rewards, turns, valid, "rloo", discount=1.0)   # f32[P, G, H]

Turn-level credit. An environment may pay a reward r_k after each turn k; the episode's return is
sum_k r_k. With episode credit (the default of `rl.credit`), every drawn token of an episode
carries the group advantage of its return. With turn credit, the tokens of turn k carry the group
advantage of its return to go G_k, the G episodes of a problem compared at the same turn index,
an episode that ended before turn k counting G_k = 0 (`turn_advantages`). Both are unbiased
policy gradients when the policy decides when its episode stops: a turn's baseline is a function
of the other episodes of its group (leave-one-out under RLOO), never of the turns its own episode
goes on to take. Normalising each turn's immediate reward among the episodes that reached that
turn and summing those over the turns an episode took (per-turn-index normalisation) is not: the
baseline then has one term per turn the episode itself took, an action-dependent baseline whose
bias charges every decision to go on the group mean of the later turns' rewards
(tests/rl/credit_test.py measures it on a toy with known returns).

References: Sutton and Barto (2018), "Reinforcement Learning: An Introduction", 2nd edition,
section 13.4 (baselines that do not depend on the action leave the policy gradient unbiased);
Feng et al. (2025), "Group-in-Group Policy Optimization for LLM Agent Training", arXiv:2505.10978
(group baselines of turns); Wei et al. (2025), "Reinforcing Multi-Turn Reasoning in LLM Agents
via Turn-Level Credit Assignment", arXiv:2505.11821 (turn-level advantages).

Shape legend (see `rl_curriculum.types`): B rows, T positions a row, H turns at most, P prompts,
G completions a prompt (B = P * G).
"""

from typing import Optional

import chex
import jax
import jax.numpy as jnp

from rl_curriculum.rl import advantages as adv_lib

__all__ = ["CREDITS", "turn_starts", "turn_ends", "turn_index", "turn_count", "last_drawn",
           "used_positions", "on_turn_ends", "on_turn_tokens", "returns_to_go",
           "shaped_turn_rewards", "turn_advantages"]

# What an episode's drawn tokens carry (`rl.credit`): the group advantage of the episode's return
# (episode) or of each turn's return to go (turn).
CREDITS = ("episode", "turn")


def _drawn(mask: jax.Array) -> jax.Array:
  chex.assert_rank(mask, 2)
  return mask > 0


def turn_starts(mask: jax.Array) -> jax.Array:
  """bool[B, T]: the first drawn position of each turn (mask f32[B, T] > 0 on drawn tokens)."""
  drawn = _drawn(mask)
  before = jnp.pad(drawn[:, :-1], ((0, 0), (1, 0)))
  return drawn & ~before


def turn_ends(mask: jax.Array) -> jax.Array:
  """bool[B, T]: the last drawn position of each turn."""
  drawn = _drawn(mask)
  after = jnp.pad(drawn[:, 1:], ((0, 0), (0, 1)))
  return drawn & ~after


def turn_index(mask: jax.Array) -> jax.Array:
  """i32[B, T]: k on the drawn positions of turn k (k = 0 for the first turn), -1 elsewhere."""
  k = jnp.cumsum(turn_starts(mask), axis=1, dtype=jnp.int32) - 1
  return jnp.where(_drawn(mask), k, -1)


def turn_count(mask: jax.Array) -> jax.Array:
  """i32[B]: the turns of each row (0 for a row with no drawn token)."""
  return jnp.sum(turn_starts(mask), axis=1, dtype=jnp.int32)


def last_drawn(mask: jax.Array) -> jax.Array:
  """i32[B]: the position of each row's last drawn token (0 for a row with none)."""
  drawn = _drawn(mask)
  t = mask.shape[1]
  return jnp.where(jnp.any(drawn, axis=1), t - 1 - jnp.argmax(drawn[:, ::-1], axis=1),
                   0).astype(jnp.int32)


def used_positions(mask: jax.Array) -> jax.Array:
  """i32[B]: the positions each row used, up to and including its last drawn token (its turns
  and the observations between them; 0 for a row with no drawn token). For a single-turn
  completion this is its number of tokens: the unit of a length cap over positions."""
  return jnp.where(jnp.any(_drawn(mask), axis=1), last_drawn(mask) + 1, 0)


def _per_turn(values: jax.Array, mask: jax.Array) -> jax.Array:
  """f32[B, T]: values[b, k] at the drawn positions of turn k of row b, 0 elsewhere (turns past
  the H columns of `values` get 0)."""
  chex.assert_rank(values, 2)
  chex.assert_equal(values.shape[0], mask.shape[0])
  index = turn_index(mask)
  h = values.shape[1]
  picked = jnp.take_along_axis(values.astype(jnp.float32), jnp.clip(index, 0, h - 1), axis=1)
  return jnp.where((index >= 0) & (index < h), picked, 0.0)


def on_turn_ends(turn_values: jax.Array, mask: jax.Array) -> jax.Array:
  """f32[B, T]: turn_values[b, k] (f32[B, H], e.g. each turn's reward) on the last drawn token of
  turn k of row b, 0 elsewhere: where a turn's reward enters a per-token return (GAE)."""
  return jnp.where(turn_ends(mask), _per_turn(turn_values, mask), 0.0)


def on_turn_tokens(turn_values: jax.Array, mask: jax.Array) -> jax.Array:
  """f32[B, T]: turn_values[b, k] (f32[B, H], e.g. each turn's advantage) on every drawn token of
  turn k of row b, 0 on observation ids and padding."""
  return _per_turn(turn_values, mask)


def returns_to_go(turn_rewards: jax.Array, discount) -> jax.Array:
  """f32[..., H]: G_k = sum_{j >= k} discount^(j - k) r_j of per-turn rewards f32[..., H]
  (discount f32[] in [0, 1], per turn)."""
  chex.assert_rank(turn_rewards, {1, 2, 3})
  rewards = jnp.moveaxis(turn_rewards.astype(jnp.float32), -1, 0)

  def back(carry, r):
    g = r + discount * carry
    return g, g

  _, g = jax.lax.scan(back, jnp.zeros_like(rewards[0]), rewards, reverse=True)
  return jnp.moveaxis(g, 0, -1)


def shaped_turn_rewards(turn_rewards: jax.Array, turns: jax.Array,
                        returns: jax.Array) -> jax.Array:
  """f32[..., H]: per-turn rewards f32[..., H] of episodes of `turns` turns (i32[...]) whose
  returns, after the run's shaping (a length penalty, whitening), are `returns` f32[...]: every
  turn keeps its own reward but the last, which gets the shaped return less the earlier turns'
  rewards, so the turns add up to the shaped return. An episode of one turn gets its shaped return
  exactly; turns at or past `turns` get 0."""
  chex.assert_equal(turn_rewards.shape[:-1], returns.shape)
  h = turn_rewards.shape[-1]
  k = jnp.arange(h, dtype=jnp.int32).reshape((1,) * turns.ndim + (h,))
  last = (turns - 1)[..., None]
  before = jnp.where(k < last, turn_rewards.astype(jnp.float32), 0.0)
  earlier = jnp.sum(before, axis=-1)
  return jnp.where(k == last, (returns - earlier)[..., None], before)


def turn_advantages(turn_rewards: jax.Array, turns: jax.Array, valid: jax.Array,
                    estimator: str, *, discount, grpo_std: str = "population",
                    baseline: Optional[jax.Array] = None) -> jax.Array:
  """f32[P, G, H] turn-level advantages: for each turn index k, the group estimator
  `advantages.ESTIMATORS[estimator]` of the returns to go G_k (`returns_to_go`) of the group's
  episodes, an episode with fewer than k + 1 turns counting G_k = 0; 0 at turns an episode did
  not take and on invalid slots.

  Under RLOO, A[p, g, k] = G_k(p, g) - mean_{j != g} G_k(p, j): the baseline of a turn reads only
  the group's other episodes, so it does not depend on whether the episode itself goes on, and
  the policy gradient stays unbiased when the policy controls termination (module docstring).

  Args:
    turn_rewards: f32[P, G, H] each turn's reward (0 past an episode's last turn).
    turns: i32[P, G] the turns each episode took.
    valid: bool[P, G] completion slots that exist.
    estimator: a name of `advantages.ESTIMATORS`.
    discount: f32[] per-turn discount in [0, 1].
    grpo_std: grpo's standard deviation (`advantages.GRPO_STDS`).
    baseline: f32[P] counterfactual's per-prompt baseline (else None).
  """
  chex.assert_rank([turn_rewards, turns, valid], [3, 2, 2])
  h = turn_rewards.shape[2]
  taken = jnp.arange(h, dtype=jnp.int32)[None, None, :] < turns[:, :, None]
  to_go = returns_to_go(jnp.where(taken, turn_rewards, 0.0), discount)

  def at_turn(g_k):
    return adv_lib.group_advantages(g_k, valid, estimator, grpo_std=grpo_std, baseline=baseline)

  per_turn = jax.vmap(at_turn, in_axes=2, out_axes=2)(to_go)
  return jnp.where(taken, per_turn, 0.0)
