"""Forward passes over scored completions: hidden states, log-probs, values, prompt features.

The learn step, SFT and the PCL curriculum all run the policy over prompt ++ completion rows; the
helpers here are that one forward pass and what is read off it. Rows are prompt-major: with
`group` = G > 1, row b = p * G + g holds completion g of prompt p, and the G rows of a prompt share
its prompt (run once per group).

Sampling temperature. The rollouts draw tokens from softmax(logits / tau); the log-probs that the
losses compare (old policy, policy being trained, reference) are those of that same distribution,
so every log-prob helper takes the temperature and divides the logits by it before normalising
(as TRL and verl do). tau = 1 leaves the logits unchanged. tau is a static Python float, or a
traced f32[] when the learn step's adaptive controller sets it (`rl_step.adapt_temperature`).

Memory. The output head's logits are the largest activation of a step (B T V values; 2048 rows x
1024 tokens x a 152k vocabulary is 1.2 TB in float32). `head_logprobs` never builds them for all
positions: it walks the completion in chunks of `chunk_size` positions under `lax.scan`, each
chunk's logits [B, c, V] computed, reduced to log-probs and entropies, and dropped; the backward
pass recomputes a chunk's logits from its hidden states (`jax.checkpoint`). `in_row_blocks` runs
a constant (no-gradient) pass over the rows a block of whole groups at a time.

Shape legend: B rows, Tp prompt tokens, T completion tokens, V vocabulary, D model width, N pool,
c positions per chunk.
"""

from typing import Any, Callable, Optional, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from rl_curriculum.model import transformer
from rl_curriculum.parallel import distributed
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.rl import logprobs as logprobs_lib

__all__ = [
    "model_params",
    "completion_hidden",
    "completion_logprobs",
    "head_logprobs",
    "in_row_blocks",
    "trained_rows",
    "row_constraint",
    "block_group",
    "split_row_blocks",
    "merge_row_blocks",
    "scaled_logits",
    "values_from_hidden",
    "prompt_features",
]


def model_params(trainable: Any, frozen: Any) -> Any:
  """The argument `transformer.forward` takes: the trainable state alone, or (trainable, frozen)."""
  return trainable if frozen is None else (trainable, frozen)


def completion_hidden(graphdef, params, prompt_tokens, prompt_mask, tokens,
                      group: int = 1, constrain: Optional[Callable[[Any, int], Any]] = None
                      ) -> jax.Array:
  """Final hidden states [B, T, D] at the positions that predict each completion token.

  The sequence is prompt ++ completion; position Tp - 1 + t predicts completion token t. Tokens
  after a row's stop are padding but only ever attend backwards, so they change nothing that
  counts. With `group` > 1 the rows come in runs of `group` completions of one prompt (a rollout
  group; each run's prompt rows are equal and the first is used): the prompt runs once per group
  (`transformer.shared_prefix_hidden`), with the same result up to float rounding.

  Args:
    graphdef, params: the policy (`params` as `model_params` builds it).
    prompt_tokens: i32[B, Tp] left-padded prompts; prompt_mask: bool[B, Tp].
    tokens: i32[B, T] completion tokens.
    group: static; rows per prompt run (1: every row runs its own prompt).
    constrain: None, or `constrain(tree, axis)` laying out the rows (dimension `axis`) of the
      shared prompt cache and of the completion rows (`transformer.shared_prefix_hidden`).

  Returns:
    [B, T, D] hidden states in the model's activation dtype.
  """
  tp, t = prompt_tokens.shape[1], tokens.shape[1]
  if group > 1:
    first = lambda x: x.reshape((-1, group) + x.shape[1:])[:, 0]
    prompt_hidden, hidden = transformer.shared_prefix_hidden(
        graphdef, params, first(prompt_tokens), first(prompt_mask), tokens, constrain=constrain)
    last = jnp.repeat(prompt_hidden[:, -1:], group, axis=0)
    return jnp.concatenate([last, hidden[:, :t - 1]], axis=1)
  seq = jnp.concatenate([prompt_tokens, tokens], axis=1)
  seq_mask = jnp.concatenate([prompt_mask.astype(bool), jnp.ones(tokens.shape, bool)], axis=1)
  hidden = transformer.forward_hidden(graphdef, params, seq, seq_mask, constrain=constrain)
  return hidden[:, tp - 1:tp - 1 + t]


def scaled_logits(graphdef, params, hidden: jax.Array,
                  temperature: Union[float, jax.Array] = 1.0) -> jax.Array:
  """Logits [B, T, V] of hidden states [B, T, D], divided by the sampling temperature: a static
  Python float > 0 (1 leaves them unchanged) or a traced f32[] (the adaptive controller's)."""
  logits = transformer.logits_from_hidden(graphdef, params, hidden)
  if not isinstance(temperature, (int, float)) or temperature != 1.0:
    logits = logits / jnp.asarray(temperature, logits.dtype)
  return logits


def completion_logprobs(graphdef, params, prompt_tokens, prompt_mask, tokens, group: int = 1,
                        temperature: float = 1.0, chunk_size: Optional[int] = None) -> jax.Array:
  """f32[B, T] log-probs of the completion tokens under softmax(logits / temperature), the head
  run `chunk_size` positions at a time (`head_logprobs`)."""
  hidden = completion_hidden(graphdef, params, prompt_tokens, prompt_mask, tokens, group)
  return head_logprobs(graphdef, params, hidden, tokens, temperature=temperature,
                       chunk_size=chunk_size)[0]


def _head_block(graphdef, params, hidden, tokens, temperature, entropy_grad, vocab_mesh=None):
  """(log-probs, entropies) f32[B, c] of one chunk of positions; the entropy has a gradient only
  with `entropy_grad`. With `vocab_mesh` the logits are split over the vocabulary."""
  logits = mesh_lib.vocab_sharded(scaled_logits(graphdef, params, hidden, temperature), vocab_mesh)
  logp = logprobs_lib.token_logprobs(logits, tokens)
  return logp, logprobs_lib.token_entropy(logits if entropy_grad else jax.lax.stop_gradient(logits))


def head_logprobs(graphdef, params, hidden: jax.Array, tokens: jax.Array, *,
                  temperature: Union[float, jax.Array] = 1.0, chunk_size: Optional[int] = None,
                  constrain: Optional[Callable[[Any], Any]] = None, entropy_grad: bool = False,
                  vocab_mesh: Any = None) -> Tuple[jax.Array, jax.Array]:
  """Log-probs and entropies of the tokens under softmax(head(hidden) / temperature), without the
  [B, T, V] logits.

  With `chunk_size` = c < T the positions are processed c at a time under `lax.scan` (T padded up
  to a multiple of c; padding positions are computed and dropped), each chunk rematerialised in
  the backward pass, so that at most one chunk's [B, c, V] logits (and their gradient) exist at a
  time. Rows stay whole in every chunk, so a row-sharded batch stays row-sharded. Values and
  gradients equal the unchunked computation up to float rounding.

  Args:
    graphdef, params: the policy (`params` as `model_params` builds it).
    hidden: [B, T, D] final hidden states (`completion_hidden`).
    tokens: i32[B, T] the tokens whose log-probs are wanted (position t predicts tokens[:, t]).
    temperature: a static Python float > 0, or a traced f32[] (`scaled_logits`).
    chunk_size: static positions per chunk; None (or >= T) computes all positions at once.
    constrain: applied to each chunk's (hidden [B, c, D], tokens [B, c]) inside the scan, e.g. a
      sharding constraint that keeps the rows over the batch axes (the scan's layout change can
      otherwise leave every chunk's rows whole on each device).
    entropy_grad: static; whether the entropy is differentiable (an entropy bonus in the loss).
      Without it the entropy carries no gradient (a metric), and no backward pass goes through it.
    vocab_mesh: None, or a mesh on which the head runs vocabulary-parallel (instead of
      `constrain`): the vocabulary weights split over their vocabulary axis
      (`mesh_lib.vocab_sharded_weights`), each chunk's rows whole on every device and its logits
      split over the vocabulary (`mesh_lib.vocab_sharded`; the softmax's max and sum become
      small all-reduces). Under FSDP the weights are otherwise gathered whole for every chunk and
      their gradient built whole ([V, D] in float32 on every device) before it is scattered.

  Returns:
    (logp f32[B, T], entropy f32[B, T]).

  Raises:
    ValueError: chunk_size < 1, or both `constrain` and `vocab_mesh`.
  """
  b, t = tokens.shape
  if constrain is not None and vocab_mesh is not None:
    raise ValueError("head_logprobs takes `constrain` or `vocab_mesh`, not both")
  if vocab_mesh is not None:
    params = mesh_lib.vocab_sharded_weights(params, vocab_mesh)
    whole = mesh_lib.replicated(vocab_mesh)
    constrain = lambda tree: jax.tree.map(
        lambda x: jax.lax.with_sharding_constraint(x, whole), tree)
  if chunk_size is None or chunk_size >= t:
    if vocab_mesh is not None:
      hidden, tokens = constrain((hidden, tokens))
    return _head_block(graphdef, params, hidden, tokens, temperature, entropy_grad, vocab_mesh)
  if chunk_size < 1:
    raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size}")
  n = -(-t // chunk_size)
  pad = n * chunk_size - t
  hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
  tokens = jnp.pad(tokens, ((0, 0), (0, pad)))
  # [B, n * c, ...] -> [n, B, c, ...]: the scan walks the chunks, every chunk holds all rows.
  chunks = lambda x: jnp.moveaxis(x.reshape((b, n, chunk_size) + x.shape[2:]), 1, 0)

  @jax.checkpoint
  def block(prm, h, tok):
    return _head_block(graphdef, prm, h, tok, temperature, entropy_grad, vocab_mesh)

  def body(carry, xs):
    return carry, block(params, *(xs if constrain is None else constrain(xs)))

  _, (logp, entropy) = jax.lax.scan(body, None, (chunks(hidden), chunks(tokens)))
  rows = lambda x: jnp.moveaxis(x, 0, 1).reshape(b, n * chunk_size)[:, :t]
  return rows(logp), rows(entropy)


def trained_rows(train_groups: jax.Array, group: int) -> jax.Array:
  """i32[P * G] rows of the groups i32[P] (prompt-major)."""
  return (train_groups[:, None] * group + jnp.arange(group)[None, :]).reshape(-1)


def row_constraint(mesh: Any) -> Optional[Callable]:
  """The `constrain(tree, axis=0)` argument of the helpers here for a run on `mesh`: rows over
  the mesh's batch axes (`mesh_lib.constrain_rows`); None without a mesh."""
  return mesh_lib.row_layout(mesh)


def block_group(rows: int, group: int, num_blocks: int) -> int:
  """The rows per prompt run within a block when `rows` rows (groups of `group`) split into
  `num_blocks` blocks: `group` when whole groups split evenly; when there are fewer groups than
  blocks, each group's rows split into equal parts (a prompt's completions spread over blocks,
  its prompt run once per part), so a block never holds more than rows / num_blocks rows.

  Raises:
    ValueError: neither whole groups nor equal parts of each group fill the blocks.
  """
  groups = rows // group
  if rows % group == 0 and groups % num_blocks == 0:
    return group
  if rows % group == 0 and num_blocks % groups == 0 and group % (num_blocks // groups) == 0:
    return group // (num_blocks // groups)
  raise ValueError(f"{rows} rows in groups of {group} do not split into {num_blocks} blocks "
                   "(of whole groups, or of equal parts of every group)")


def split_row_blocks(arrays: Any, *, group: int, num_blocks: int) -> Any:
  """[B, ...] arrays (rows in groups of `group`, prompt-major) -> [num_blocks, B / num_blocks, ...].

  Block j holds the groups j, j + num_blocks, j + 2 num_blocks, ... (strided, so that a batch
  sharded over rows keeps every block spread over the same devices), or with fewer groups than
  blocks the parts of groups (`block_group`); `merge_row_blocks` undoes it.

  Raises:
    ValueError: the rows do not split into num_blocks blocks (`block_group`).
  """
  rows = jax.tree.leaves(arrays)[0].shape[0]
  part = block_group(rows, group, num_blocks)
  parts = rows // part

  def split(x):
    x = x.reshape((parts // num_blocks, num_blocks, part) + x.shape[1:])
    return jnp.moveaxis(x, 1, 0).reshape((num_blocks, rows // num_blocks) + x.shape[3:])

  return jax.tree.map(split, arrays)


def merge_row_blocks(blocks: Any, *, group: int) -> Any:
  """The inverse of `split_row_blocks`: [num_blocks, B / num_blocks, ...] -> [B, ...]."""

  def merge(x):
    num_blocks, block_rows = x.shape[:2]
    part = block_group(num_blocks * block_rows, group, num_blocks)
    x = x.reshape((num_blocks, block_rows // part, part) + x.shape[2:])
    return jnp.moveaxis(x, 0, 1).reshape((num_blocks * block_rows,) + x.shape[3:])

  return jax.tree.map(merge, blocks)


def in_row_blocks(fn: Callable[..., Any], arrays: Any, *, group: int, num_blocks: int) -> Any:
  """fn applied to `num_blocks` blocks of rows (`split_row_blocks`), one block at a time under
  `lax.map`, the results put back in row order; with one block this is fn(arrays). `fn(block)`
  returns a pytree of [B / num_blocks, ...] arrays; a block's rows come in runs of
  `block_group(B, group, num_blocks)` completions of one prompt.

  For passes without gradient (old policy, reference): memory is that of one block.
  """
  if num_blocks == 1:
    return fn(arrays)
  out = jax.lax.map(fn, split_row_blocks(arrays, group=group, num_blocks=num_blocks))
  return merge_row_blocks(out, group=group)


def values_from_hidden(value: dict, hidden: jax.Array) -> jax.Array:
  """f32[B, T] estimates of the value head {"w": f32[D], "b": f32[]} on hidden states [B, T, D]."""
  return jnp.einsum("btd,d->bt", hidden.astype(jnp.float32), value["w"]) + value["b"]


def _mean_pooled(graphdef, params, tokens, mask):
  hidden = transformer.forward_hidden(graphdef, params, tokens, mask)
  m = mask.astype(jnp.float32)[..., None]
  return (hidden.astype(jnp.float32) * m).sum(1) / jnp.maximum(m.sum(1), 1.0)


_mean_pooled_jit = jax.jit(_mean_pooled, static_argnums=(0,))


def prompt_features(graphdef, params, tokens: np.ndarray, mask: np.ndarray, *,
                    batch_size: int) -> np.ndarray:
  """f32[N, D] mean-pooled final hidden states of N prompts, `batch_size` prompts at a time.

  The features a prompt-level value model (PCL) reads. Memory is that of one batch: the last
  batch is padded to full size (one compiled program) and the padding rows dropped.

  Args:
    graphdef, params: the policy.
    tokens: i32[N, Tp] left-padded prompts; mask: bool[N, Tp], at least one True per row.
    batch_size: prompts per forward pass (>= 1).

  Returns:
    f32[N, D] host array.

  Raises:
    ValueError: batch_size < 1.
  """
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  tokens, mask = np.asarray(tokens), np.asarray(mask, bool)
  n = tokens.shape[0]
  size = min(batch_size, n)
  out = []
  for start in range(0, n, size):
    tok, msk = tokens[start:start + size], mask[start:start + size]
    short = size - tok.shape[0]
    if short:
      tok = np.concatenate([tok, np.repeat(tok[-1:], short, axis=0)])
      msk = np.concatenate([msk, np.repeat(msk[-1:], short, axis=0)])
    feats = distributed.to_host(_mean_pooled_jit(graphdef, params, jnp.asarray(tok),
                                                 jnp.asarray(msk)))
    out.append(feats[:size - short])
  return np.concatenate(out).astype(np.float32)
