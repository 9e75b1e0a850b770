"""Example scored rollouts: `Batch`es of given shapes, for benchmarks and tests.

`make_batch` assembles a batch from the arrays a caller cares about and fills the rest the way a
plain rollout would (every token counts, every completion exists, every group is trained on, a
completion that fills its row without a stop token was cut).
`example_batch` draws the arrays from a seed: random prompts, completions and 0/1 rewards of
P prompts x G completions, the same on every call with the same arguments.

  batch = examples.example_batch(prompts=8, group=4, prompt_len=64, completion_len=64,
                                 vocab_size=49152)
"""

from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rl_curriculum.rl import rewards as rewards_lib
from rl_curriculum.train.learn.rl_types import Batch


def random_prompts(batch: int, length: int, vocab_size: int, seed: int = 0,
                   low: int = 3) -> np.ndarray:
  """Uniform token ids: i32[B, Tp] in [low, vocab_size), from `np.random.default_rng(seed)`.

  With `low` = 3 no prompt holds the pad, unknown or BOS id (0, 1, 2) of this project's
  tokenizers; benchmarks/peers/tunix_peer.py draws its prompts the same way.
  """
  return np.random.default_rng(seed).integers(low, vocab_size, (batch, length)).astype(np.int32)


def make_batch(prompt_tokens, tokens, rewards, *, prompt_mask=None, mask=None,
               sampler_logprob: float = 0.0, correct=None, num_arms: int = 1,
               train_groups: Optional[jax.Array] = None,
               train_valid: Optional[jax.Array] = None,
               stop_ids: Sequence[int] = (), turn_rewards=None) -> Batch:
  """A `Batch` of S groups x G completions from its token arrays and rewards.

  Args:
    prompt_tokens: i32[R, Tp] prompt of each row, R = S * G (a group's G rows repeat its prompt).
    tokens: i32[R, T] completion tokens.
    rewards: f32[S, G] rewards of each group's completions.
    prompt_mask: bool[R, Tp] real prompt tokens; None: all of them.
    mask: f32[R, T] completion tokens that count; None: all of them.
    sampler_logprob: the log-probability the sampler reports for every completion token.
    correct: bool[S, G]; None: rewards > 0.5.
    num_arms: group s belongs to arm s % num_arms; prompt ids are 0..S-1.
    train_groups: i32[P] groups the policy trains on; None: all S in order.
    train_valid: bool[P]; None: every slot is a real group.
    stop_ids: the tokens that end a completion: one whose last drawn token is none of them was
      cut by a limit (`Batch.truncated`, `rewards.truncated_completions`).
    turn_rewards: f32[S, G, H] each turn's reward (rows with turns: runs of counted tokens);
      None: every row's reward on its last turn.

  Returns:
    A `Batch` of JAX arrays, every completion valid.
  """
  rewards = jnp.asarray(rewards, jnp.float32)
  s = rewards.shape[0]
  prompt_tokens = jnp.asarray(prompt_tokens, jnp.int32)
  tokens = jnp.asarray(tokens, jnp.int32)
  mask = jnp.ones(tokens.shape, jnp.float32) if mask is None else jnp.asarray(mask, jnp.float32)
  train_groups = (jnp.arange(s, dtype=jnp.int32) if train_groups is None
                  else jnp.asarray(train_groups, jnp.int32))
  return Batch(
      prompt_tokens=prompt_tokens,
      prompt_mask=(jnp.ones(prompt_tokens.shape, bool) if prompt_mask is None
                   else jnp.asarray(prompt_mask, bool)),
      tokens=tokens,
      mask=mask,
      sampler_logprobs=jnp.full(tokens.shape, sampler_logprob, jnp.float32),
      prompt_ids=jnp.arange(s, dtype=jnp.int32),
      arms=jnp.arange(s, dtype=jnp.int32) % num_arms,
      rewards=rewards,
      correct=rewards > 0.5 if correct is None else jnp.asarray(correct, bool),
      valid=jnp.ones(rewards.shape, bool),
      train_groups=train_groups,
      train_valid=(jnp.ones(train_groups.shape, bool) if train_valid is None
                   else jnp.asarray(train_valid, bool)),
      truncated=rewards_lib.truncated_completions(tokens, mask, stop_ids).reshape(rewards.shape),
      turn_rewards=None if turn_rewards is None else jnp.asarray(turn_rewards, jnp.float32))


def example_batch(prompts: int, group: int, prompt_len: int, completion_len: int,
                  vocab_size: int, *, seed: int = 0, low: int = 3,
                  num_arms: int = 6) -> Batch:
  """A random scored batch of P prompts x G completions, deterministic in `seed`.

  The prompts are `random_prompts(P, Tp, V, seed, low)`, the ones a sampler benchmark at batch P
  sees, each repeated for its G rows. A second generator seeded alike draws the rewards (0 or 1,
  f32[P, G]) and then the completions (i32[P G, T] in [low, V)). The sampler's log-probability of
  every token is that of the uniform distribution, -log V.

  Args:
    prompts: P, the groups (all trained on).
    group: G, completions per prompt.
    prompt_len: Tp, prompt tokens (no padding).
    completion_len: T, completion tokens (all counted).
    vocab_size: V.
    seed: seed of both generators.
    low: smallest token id drawn.
    num_arms: prompt p belongs to arm p % num_arms.

  Returns:
    A `Batch` with R = P G rows.
  """
  rng = np.random.default_rng(seed)
  rewards = rng.integers(0, 2, (prompts, group)).astype(np.float32)
  tokens = rng.integers(low, vocab_size, (prompts * group, completion_len))
  prompt_tokens = np.repeat(random_prompts(prompts, prompt_len, vocab_size, seed, low), group,
                            axis=0)
  return make_batch(prompt_tokens, tokens, rewards, sampler_logprob=-np.log(vocab_size),
                    num_arms=num_arms)
