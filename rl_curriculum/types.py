"""Pytrees shared across the package, and the shape-letter legend used in every docstring.

Shape legend:
  B  batch rows (B = P * G in a rollout)     P  prompts (groups) the policy trains on in a step
  S  prompts sampled in a step (S = P, or    G  completions per prompt (a group)
     P x oversample with a post-rollout      T  time (tokens)
     filter; the curriculum sees all S)      V  vocabulary
  K  arms (curriculum categories)            N  prompts in the pool
  D  feature width
"""

from typing import NamedTuple, Optional

import jax


class Selection(NamedTuple):
  """What a curriculum chose for one step: the S prompts to sample."""
  prompt_ids: jax.Array  # i32[S] indices into the prompt pool
  arms: jax.Array        # i32[S] arm (category) of each chosen prompt
  active: Optional[jax.Array] = None  # bool[S] prompts to roll out; None = all (a pre-rollout
                                      # skip leaves its slot without completions)


class Feedback(NamedTuple):
  """What a step taught about the S prompts it sampled (every one, trained on or filtered out);
  the input of `Curriculum.update`."""
  prompt_ids: jax.Array  # i32[S] indices into the prompt pool
  arms: jax.Array        # i32[S] arm of each prompt
  rewards: jax.Array     # f32[S, G] shaped scalar reward per completion
  correct: jax.Array     # bool[S, G] raw correctness (never the shaped reward)
  advantages: jax.Array  # f32[S, G] per-completion advantage (masked token mean if token-level)
  valid: Optional[jax.Array] = None  # bool[S, G] completion slots that exist; None = all


class Rollout(NamedTuple):
  """Sampler output for B = S * G rows."""
  prompt_tokens: jax.Array  # i32[B, Tp] left-padded prompts
  tokens: jax.Array         # i32[B, T] completion tokens (pad after a row stops)
  logprobs: jax.Array       # f32[B, T] log-prob of each sampled token under the policy
  mask: jax.Array           # f32[B, T] 1 on completion tokens that count, 0 after stop
