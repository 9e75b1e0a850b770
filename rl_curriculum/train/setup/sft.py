"""Supervised warm start: teach the format (and some skill) before RL by next-token loss on targets.

Sequences are a left-padded prompt followed by the problem's solving episode as a rollout writes
it (`episodes.demonstration_rows`: a single-turn task's target and EOS; an environment's turns,
each with its end-of-turn id, and its replies between them), right-padded; only the policy's
turns carry loss, never the replies, as in RL. The result is cached in the run's workdir, so a resumed or repeated run
skips it; a long warm start also saves its progress (`warm_start.sft_params`), so a killed one
resumes where it stopped.
"""

import functools
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rl_curriculum.rl import losses
from rl_curriculum.tasks.data import TaskPool
from rl_curriculum.train.learn import forward


def sft_loss(params, graphdef, prompt_tokens, prompt_mask, tokens, mask):
  """Mean negative log-likelihood per target token (scalar)."""
  logp = forward.completion_logprobs(graphdef, params, prompt_tokens, prompt_mask, tokens)
  return -losses.masked_mean(logp, mask)


@functools.partial(jax.jit, static_argnames=("graphdef", "optimizer"), donate_argnums=(0, 1))
def sft_step(params, opt_state, batch, *, graphdef, optimizer):
  """One optimizer step on a batch (prompt_tokens, prompt_mask, tokens, mask); returns loss."""
  loss, grads = jax.value_and_grad(sft_loss)(params, graphdef, *batch)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


def run_sft(params: Any, graphdef, pool: TaskPool, targets: np.ndarray, target_mask: np.ndarray,
            *, steps: int, batch_size: int, optimizer: optax.GradientTransformation, seed: int,
            log_every: int = 50, log=print, done: int = 0, opt_state: Any = None,
            curve: Sequence[float] = (), save_every: int = 0,
            save: Optional[Callable[[int, Any, Any, list[float]], None]] = None
            ) -> tuple[Any, list[float]]:
  """Trains `params` for `steps` batches drawn uniformly (seeded) from the pool; returns the new
  params and the loss curve.

  A run resumed after `done` steps passes the `opt_state` and loss `curve` saved with them: the
  batches drawn are the uninterrupted run's (the seeded draws of the first `done` steps are
  replayed), so the result is the same to the bit. With `save`, `save(step, params, opt_state,
  curve)` is called after every `save_every`-th step but the last.
  """
  rng = np.random.default_rng(seed)
  for _ in range(done):
    rng.integers(0, len(pool.problems), batch_size)
  opt_state = optimizer.init(params) if opt_state is None else opt_state
  curve = list(curve)
  for step in range(done + 1, steps + 1):
    idx = rng.integers(0, len(pool.problems), batch_size)
    batch = (jnp.asarray(pool.tokens[idx]), jnp.asarray(pool.mask[idx]),
             jnp.asarray(targets[idx]), jnp.asarray(target_mask[idx]))
    params, opt_state, loss = sft_step(params, opt_state, batch, graphdef=graphdef,
                                       optimizer=optimizer)
    curve.append(float(loss))
    if log_every and (step % log_every == 0 or step == steps):
      log(f"sft step {step}/{steps}: loss {np.mean(curve[-log_every:]):.4f}")
    if save is not None and save_every and step % save_every == 0 and step < steps:
      save(step, params, opt_state, curve)
  return params, curve
