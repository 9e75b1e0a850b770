"""KV-cache sampler: prefill the left-padded prompts, then decode in a `lax.while_loop`.

Two device programs per call (`prefill`, `decode`, both public for callers that want the state),
each compiled once per (graphdef, batch B, prompt length Tp, max_new_tokens N, strategy) and
cached by `jax.jit`:

  prefill   prompts i32[B, Tp] -> SamplingState (cache of S = Tp + N slots, first logits; each
            group's prompt prefilled once, `prompt_prefill`, then copied to its G rows)
  decode    SamplingState -> SamplingState, donated: while step < N and some row is running,
            sample a token per row, record it, feed it through the cache (one slot per step,
            `dynamic_update_slice`): each token costs one position of compute plus attention
            over the S slots; the prefix is never recomputed. The N-th token is recorded but
            not fed (nothing reads its logits): N tokens cost N - 1 decode forwards, and the
            final state's logits, cache and positions are those after token N - 1.

Log-probs: `Rollout.logprobs[b, t] = log_softmax(logits / temperature)[token]`, the log-prob of
the token under the tempered policy the tokens were drawn from (the RL losses compute their
log-probs the same way, `train.learn.forward`), before top-k and top-p: a filter renormalises over fewer
tokens, and these log-probs do not account for it. With `greedy` the temperature is ignored and the
log-probs are those of the raw logits.

Randomness: row b's t-th token is drawn with fold_in(fold_in(key, b), t) (`strategies.row_keys`),
never with a key of the batch, so `sampling.continuous`, which runs rows in whatever decode slot
is free, draws the same tokens.

Stopping: a row stops at the first token in {eos_id} | stop_ids. The stop token is kept and
counted (mask 1); every later slot of the row holds pad_id with log-prob 0 and mask 0. The loop
exits early once every row has stopped; slots never reached also hold pad_id, 0, 0.
"""

import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from rl_curriculum.model import decoding
from rl_curriculum.model import kv_cache
from rl_curriculum.model import transformer
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.sampling import prompt_prefill
from rl_curriculum.sampling import strategies
from rl_curriculum.types import Rollout


def _row_layout(mesh):
  """`constrain(tree, axis)` keeping rows over `mesh`'s batch axes, or None without a mesh."""
  return mesh_lib.row_layout(mesh)


class SamplingState(NamedTuple):
  """Everything the decode loop carries; donated to the decode program."""
  tokens: jax.Array     # i32[B, N] completion buffer, pad_id where nothing counts
  logprobs: jax.Array   # f32[B, N] log-prob of each recorded token under logits / temperature
  mask: jax.Array       # f32[B, N] 1 on recorded tokens (stop token included), else 0
  logits: jax.Array     # f32[B, V] raw logits of each row's next token
  cache: kv_cache.KVCache  # S = Tp + N slots: L x [B, S, Hkv, hd], or [L, B, S, Hkv, hd]
  key_mask: jax.Array   # bool[B, S] valid cache slots (prompt padding False)
  positions: jax.Array  # i32[B] rotary position of the next token of each row
  done: jax.Array       # bool[B] row has emitted a stop token (or reached its limit)
  limit: jax.Array      # i32[B] tokens a row may record (max_new_tokens, or `stop_after`)
  step: jax.Array       # i32[] tokens generated so far (= next column of the buffers)
  key: jax.Array        # PRNG key; row b's token t draws with `strategies.row_keys`


@functools.partial(jax.jit, static_argnums=(0,),
                   static_argnames=("max_new_tokens", "pad_id", "group", "mesh", "chunk"))
def prefill(graphdef, params, prompt_tokens, prompt_mask, key, active=None, stop_after=None, *,
            max_new_tokens, pad_id=0, group=1, mesh=None, chunk=0):
  """The first device program: prompts i32[B, Tp] (left-padded, mask bool[B, Tp]) into a fresh
  SamplingState with S = Tp' + max_new_tokens cache slots (Tp' = Tp, or Tp left-padded to a
  multiple of `chunk`: `prompt_prefill`). With `group` > 1 the rows come in runs of `group`
  equal prompts: each run's first prompt is prefilled (`prompt_prefill.prefill_prompts`, in
  chunks of `chunk` positions) and its cache and logits copied to the run (along the cache's row
  axis, 1 for a scanned model's stacked cache). With a `mesh`, the prefilled prompts and the
  repeated cache keep their rows over its batch axes (`mesh_lib.constrain_rows`; without it
  GSPMD may prefill every prompt on every device). Jitted; graphdef, max_new_tokens, pad_id,
  group, mesh and chunk are static. Rows where `active` (bool[B], or None for all) is False
  start stopped: they record nothing and end the loop like finished rows. `stop_after` (i32[B]
  in [1, max_new_tokens], or None) stops row b after its stop_after[b]-th token."""
  b, tp = prompt_tokens.shape
  prompt_mask = prompt_mask.astype(bool)
  first = lambda x: x.reshape((b // group, group) + x.shape[1:])[:, 0]
  firsts = mesh_lib.constrain_rows((first(prompt_tokens), first(prompt_mask)), mesh)
  logits, cache, firsts_mask = prompt_prefill.prefill_prompts(
      graphdef, params, *firsts, chunk=chunk, constrain=_row_layout(mesh))
  rows = kv_cache.cache_batch_axis(cache)
  logits, cache = mesh_lib.constrain_rows(logits, mesh), mesh_lib.constrain_rows(cache, mesh, rows)

  def extend(x):  # the group's copies, then max_new_tokens free slots
    x = jnp.repeat(x, group, axis=rows)
    free = x.shape[:rows + 1] + (max_new_tokens,) + x.shape[rows + 2:]
    return jnp.concatenate([x, jnp.zeros(free, x.dtype)], axis=rows + 1)

  logits = mesh_lib.constrain_rows(jnp.repeat(logits, group, axis=0), mesh)
  cache = mesh_lib.constrain_rows(jax.tree.map(extend, cache), mesh, rows)
  row_mask = jnp.repeat(firsts_mask, group, axis=0)
  limit = (jnp.full((b,), max_new_tokens, jnp.int32) if stop_after is None
           else jnp.asarray(stop_after, jnp.int32))
  return SamplingState(
      tokens=jnp.full((b, max_new_tokens), pad_id, jnp.int32),
      logprobs=jnp.zeros((b, max_new_tokens), jnp.float32),
      mask=jnp.zeros((b, max_new_tokens), jnp.float32),
      logits=logits,
      cache=cache,
      key_mask=kv_cache.cache_key_mask(row_mask, row_mask.shape[1] + max_new_tokens),
      positions=jnp.sum(row_mask, axis=-1, dtype=jnp.int32),
      done=jnp.zeros((b,), bool) if active is None else ~jnp.asarray(active, bool),
      limit=limit,
      step=jnp.zeros((), jnp.int32),
      key=key)


@functools.partial(
    jax.jit, static_argnums=(0,),
    static_argnames=("top_k", "top_p", "greedy", "stop_ids", "pad_id", "mesh"),
    donate_argnames=("state",))
def decode(graphdef, params, state, temperature, *, top_k=0, top_p=1.0, greedy=False,
           stop_ids=(), pad_id=0, mesh=None):
  """The second device program: runs the decode loop on a donated SamplingState until every row
  has stopped or max_new_tokens tokens exist; returns the final state (`state.step` = number of
  loop iterations run). temperature is traced f32[]; the keyword arguments are static, and
  stop_ids must be a sorted tuple of ints. `sample` wraps prefill and decode."""
  num_new = state.tokens.shape[1]
  prompt_len = state.key_mask.shape[1] - num_new
  stop = jnp.asarray(stop_ids, jnp.int32)

  def running(s):
    return (s.step < num_new) & ~jnp.all(s.done)

  def record(s):
    """Samples each row's next token from s.logits and writes it to column s.step."""
    keys = strategies.row_keys(s.key, jnp.arange(s.tokens.shape[0], dtype=jnp.int32), s.step)
    token, logprob = strategies.draw_tokens(s.logits, keys, temperature=temperature,
                                            top_k=top_k, top_p=top_p, greedy=greedy)
    live = ~s.done
    token = jnp.where(live, token, pad_id)
    column = (0, s.step)
    tokens = jax.lax.dynamic_update_slice(s.tokens, token[:, None], column)
    logprobs = jax.lax.dynamic_update_slice(
        s.logprobs, jnp.where(live, logprob, 0.0)[:, None], column)
    mask = jax.lax.dynamic_update_slice(s.mask, live.astype(jnp.float32)[:, None], column)
    done = s.done | (live & (jnp.any(token[:, None] == stop[None, :], axis=-1)
                             | (s.step + 1 >= s.limit)))
    return token, s._replace(tokens=tokens, logprobs=logprobs, mask=mask, done=done,
                             step=s.step + 1)

  def advance(s):
    token, new = record(s)
    logits, cache = decoding.decode_step(graphdef, params, token, s.positions, s.key_mask,
                                         s.cache, prompt_len + s.step,
                                         constrain=_row_layout(mesh))
    return new._replace(logits=logits, cache=cache, positions=s.positions + 1)

  # Tokens 0 .. N-2 are recorded and fed through the model; the last one is only recorded (its
  # logits would never be used), which saves one forward step of the N.
  state = jax.lax.while_loop(lambda s: (s.step < num_new - 1) & ~jnp.all(s.done), advance, state)
  return jax.lax.cond(running(state), lambda s: record(s)[1], lambda s: s, state)


def sample(graphdef: nnx.GraphDef, params: transformer.Params, prompt_tokens: jax.Array,
           prompt_mask: jax.Array, key: jax.Array, *, max_new_tokens: int, eos_id: int,
           temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, greedy: bool = False,
           stop_ids: Sequence[int] = (), pad_id: int = 0, group: int = 1,
           mesh=None, active=None, stop_after=None, prefill_chunk: int = 0) -> Rollout:
  """Samples up to `max_new_tokens` tokens after each left-padded prompt.

  Args:
    graphdef, params: the policy, from `nnx.split` (params may be a tuple of states, e.g.
      `(lora_params, base_params)`, or `lora.disable(params)` for the reference model).
    prompt_tokens: i32[B, Tp], left-padded; prompt_mask: bool[B, Tp], True on real tokens, at
      least one per row.
    key: PRNG key of this call (e.g. `fold_in(root_key, step)`); unused when greedy.
    max_new_tokens: N, static (one compile per B, Tp, N).
    eos_id, stop_ids: a row stops at the first token among them (kept, counted in the mask).
    temperature: > 0, traced (changing it does not recompile); ignored when greedy.
    top_k: static; 0 = off. top_p: static, in (0, 1]; 1 = off. greedy: static; argmax.
    pad_id: written after a row stops.
    group: static; > 1 when the rows come in runs of `group` equal prompts (G completions per
      prompt, as in an RL rollout): each prompt is prefilled once for its run. Other rows of a
      run are not read.
    mesh: static; the run's mesh when the prompts are sharded over its batch axes (see
      `prefill`), else None.
    active: optional bool[B] (sharded like the prompts): rows to sample; the others get no
      tokens (pad_id, log-prob 0, mask 0), as rows that stopped at once. None samples every row.
    stop_after: optional i32[B] in [1, max_new_tokens]: row b stops after that many tokens (a
      length the caller imposes, e.g. a benchmark's workload), else at max_new_tokens.
    prefill_chunk: static; prompt positions per prefill pass (`prompt_prefill`), 0 = whole.

  Returns:
    Rollout(prompt_tokens i32[B, Tp], tokens i32[B, N], logprobs f32[B, N] under logits /
    temperature (see the module docstring), mask f32[B, N]).

  Raises:
    ValueError: bad shapes or settings (non-positive max_new_tokens or temperature, top_k < 0,
      top_p outside (0, 1]).
  """
  if not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
    raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}.")
  if prompt_tokens.ndim != 2 or prompt_tokens.shape != prompt_mask.shape:
    raise ValueError(f"prompt_tokens {prompt_tokens.shape} and prompt_mask {prompt_mask.shape} "
                     "must both be [B, Tp].")
  if not greedy and isinstance(temperature, (int, float)) and temperature <= 0:
    raise ValueError(f"temperature must be > 0 (use greedy=True for argmax), got {temperature}.")
  if not isinstance(top_k, int) or top_k < 0:
    raise ValueError(f"top_k must be an int >= 0 (0 = off), got {top_k!r}.")
  if not 0.0 < top_p <= 1.0:
    raise ValueError(f"top_p must be in (0, 1], got {top_p!r}.")
  if not isinstance(group, int) or group < 1 or prompt_tokens.shape[0] % group:
    raise ValueError(f"group must be a positive int dividing the {prompt_tokens.shape[0]} rows, "
                     f"got {group!r}.")
  stop = tuple(sorted({int(eos_id), *(int(s) for s in stop_ids)}))
  prompt_tokens = jnp.asarray(prompt_tokens, jnp.int32)
  state = prefill(graphdef, params, prompt_tokens, prompt_mask, key, active, stop_after,
                  max_new_tokens=max_new_tokens, pad_id=int(pad_id), group=group, mesh=mesh,
                  chunk=int(prefill_chunk))
  state = decode(graphdef, params, state, jnp.asarray(temperature, jnp.float32),
                  top_k=top_k, top_p=float(top_p), greedy=bool(greedy), stop_ids=stop,
                  pad_id=int(pad_id), mesh=mesh)
  return Rollout(prompt_tokens=prompt_tokens, tokens=state.tokens, logprobs=state.logprobs,
                 mask=state.mask)
