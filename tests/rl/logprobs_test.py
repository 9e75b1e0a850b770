"""Tests for rl_curriculum.rl.logprobs: loop references, chunked == unchunked, gradients, memory."""

import functools
import math

import jax
import jax.numpy as jnp
from jax.test_util import check_grads
import numpy as np
import pytest

from rl_curriculum.rl import logprobs
import test_util

# None: unchunked; 1: one token a chunk; 3: with a remainder (T = 7); 7: exactly T; 16: above T.
CHUNKS = pytest.mark.parametrize("chunk_size", [None, 1, 3, 7, 16])


def ref_logprobs(logits, tokens):
  logits = np.asarray(logits, np.float64)
  b_count, t_count, v_count = logits.shape
  out = np.zeros((b_count, t_count))
  for b in range(b_count):
    for t in range(t_count):
      row = logits[b, t]
      top = max(row)
      lse = top + math.log(sum(math.exp(x - top) for x in row))
      out[b, t] = row[tokens[b, t]] - lse
  return out


def ref_entropy(logits):
  logits = np.asarray(logits, np.float64)
  b_count, t_count, v_count = logits.shape
  out = np.zeros((b_count, t_count))
  for b in range(b_count):
    for t in range(t_count):
      row = logits[b, t]
      top = max(row)
      z = sum(math.exp(x - top) for x in row)
      h = 0.0
      for x in row:
        p = math.exp(x - top) / z
        if p > 0:
          h -= p * math.log(p)
      out[b, t] = h
  return out


def _inputs(b=3, t=7, v=11, seed=0, scale=3.0):
  key = jax.random.PRNGKey(seed)
  k1, k2 = jax.random.split(key)
  logits = scale * jax.random.normal(k1, (b, t, v), jnp.float32)
  tokens = jax.random.randint(k2, (b, t), 0, v)
  return logits, tokens


@test_util.JIT
@CHUNKS
def test_token_logprobs_matches_reference(use_jit, chunk_size):
  logits, tokens = _inputs()
  out = test_util.maybe_jit(logprobs.token_logprobs, use_jit, chunk_size=chunk_size)(logits, tokens)
  assert out.dtype == jnp.float32 and out.shape == tokens.shape
  np.testing.assert_allclose(out, ref_logprobs(logits, np.asarray(tokens)), **test_util.TOL)
  np.testing.assert_allclose(out, logprobs.token_logprobs(logits, tokens), **test_util.TOL)


@test_util.JIT
@CHUNKS
def test_token_entropy_matches_reference(use_jit, chunk_size):
  logits, _ = _inputs()
  out = test_util.maybe_jit(logprobs.token_entropy, use_jit, chunk_size=chunk_size)(logits)
  assert out.dtype == jnp.float32
  np.testing.assert_allclose(out, ref_entropy(logits), **test_util.TOL)
  np.testing.assert_allclose(out, logprobs.token_entropy(logits), **test_util.TOL)
  assert np.all(np.asarray(out) >= 0) and np.all(np.asarray(out) <= math.log(11) + 1e-5)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("chunk_size", [None, 3])
def test_low_precision_logits_computed_in_float32(dtype, chunk_size):
  logits, tokens = _inputs(scale=8.0)
  low = logits.astype(dtype)
  lp = logprobs.token_logprobs(low, tokens, chunk_size=chunk_size)
  h = logprobs.token_entropy(low, chunk_size=chunk_size)
  assert lp.dtype == jnp.float32 and h.dtype == jnp.float32
  widened = np.asarray(low.astype(jnp.float32))
  np.testing.assert_allclose(lp, ref_logprobs(widened, np.asarray(tokens)), **test_util.TOL)
  np.testing.assert_allclose(h, ref_entropy(widened), **test_util.TOL)


def test_minus_inf_logits_are_allowed():
  logits, tokens = _inputs(b=2, t=4, v=6)
  logits = logits.at[:, :, 5].set(-jnp.inf)  # a masked vocabulary entry, never sampled
  tokens = jnp.minimum(tokens, 4)
  for chunk_size in (None, 3):

    def total(x, chunk_size=chunk_size):
      return (jnp.sum(logprobs.token_logprobs(x, tokens, chunk_size=chunk_size))
              + jnp.sum(logprobs.token_entropy(x, chunk_size=chunk_size)))

    lp = logprobs.token_logprobs(logits, tokens, chunk_size=chunk_size)
    h = logprobs.token_entropy(logits, chunk_size=chunk_size)
    np.testing.assert_allclose(lp, ref_logprobs(logits, np.asarray(tokens)), **test_util.TOL)
    np.testing.assert_allclose(h, ref_entropy(logits), **test_util.TOL)
    grads = jax.jit(jax.grad(total))(logits)
    assert np.all(np.isfinite(np.asarray(grads)))


# Gradients are compared under jit only: op-by-op differentiation of a rematerialised scan
# recompiles its body on every call (seconds each), and the forward tests cover the no-jit path.
@pytest.mark.parametrize("chunk_size", [1, 3, 7])
def test_chunked_gradients_equal_unchunked(chunk_size):
  logits, tokens = _inputs()
  w = jax.random.normal(jax.random.PRNGKey(5), tokens.shape)

  def objective(x, chunk):
    return (jnp.sum(w * logprobs.token_logprobs(x, tokens, chunk_size=chunk))
            + jnp.sum(w * logprobs.token_entropy(x, chunk_size=chunk)))

  grad_fn = jax.jit(jax.grad(objective), static_argnums=1)
  np.testing.assert_allclose(grad_fn(logits, chunk_size), grad_fn(logits, None), **test_util.TOL)


def test_logprob_gradient_is_onehot_minus_softmax():
  logits, tokens = _inputs(b=2, t=3, v=5)
  x = np.asarray(logits, np.float64)
  g = jax.jit(jax.grad(lambda z: jnp.sum(logprobs.token_logprobs(z, tokens, chunk_size=2))))(
      logits)
  expected = np.zeros_like(x)
  for b in range(2):
    for t in range(3):
      z = sum(math.exp(v) for v in x[b, t])
      for v in range(5):
        expected[b, t, v] = (1.0 if v == int(tokens[b, t]) else 0.0) - math.exp(x[b, t, v]) / z
  np.testing.assert_allclose(g, expected, **test_util.TOL)


@pytest.mark.parametrize("chunk_size", [None, 2])
def test_check_grads(chunk_size):
  logits, tokens = _inputs(b=2, t=5, v=4, scale=1.0)
  f = jax.jit(lambda x: (logprobs.token_logprobs(x, tokens, chunk_size=chunk_size)
                         + logprobs.token_entropy(x, chunk_size=chunk_size)))
  check_grads(f, (logits,), order=1, modes=["rev"], eps=1e-2, atol=1e-3, rtol=1e-3)


def test_chunk_size_must_be_positive():
  logits, tokens = _inputs()
  with pytest.raises(ValueError, match="chunk_size"):
    logprobs.token_logprobs(logits, tokens, chunk_size=0)


def _walk_avals(jaxpr):
  """Yields the abstract value of every variable produced anywhere in a (nested) jaxpr."""
  for eqn in jaxpr.eqns:
    for var in eqn.outvars:
      yield var.aval
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          yield from _walk_avals(inner)


def _has_full_f32(fn, *args, shape):
  """Whether any float32 value as large as `shape` (in any layout, e.g. stacked chunks) appears."""
  jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
  return any(getattr(a, "dtype", None) == jnp.float32 and a.size >= math.prod(shape)
             for a in _walk_avals(jaxpr))


def test_chunked_path_never_holds_full_float32_logits():
  b, t, v = 2, 12, 16
  logits, tokens = _inputs(b=b, t=t, v=v)
  logits = logits.astype(jnp.bfloat16)

  def loss(x, chunk):
    return (jnp.sum(logprobs.token_logprobs(x, tokens, chunk_size=chunk))
            + jnp.sum(logprobs.token_entropy(x, chunk_size=chunk)))

  # The detector works: the unchunked path does build the full float32 tensor.
  assert _has_full_f32(functools.partial(loss, chunk=None), logits, shape=(b, t, v))
  for chunk in (4, 5):  # 5 leaves a remainder of 2 tokens
    fwd = functools.partial(loss, chunk=chunk)
    assert not _has_full_f32(fwd, logits, shape=(b, t, v))
    assert not _has_full_f32(jax.grad(fwd), logits, shape=(b, t, v))
