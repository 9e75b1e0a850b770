"""The test suite's own set-up (tests/conftest.py): a worker stays within the kernel's memory
mappings however many programs it compiles."""

import os

import jax
import jax.numpy as jnp
import numpy as np

import test_util


def test_map_pressure_is_the_share_of_the_limit(tmp_path):
  maps, limit = tmp_path / "maps", tmp_path / "max_map_count"
  maps.write_text("a\nb\nc\n")
  limit.write_text("12\n")
  assert test_util.map_pressure(str(maps), str(limit)) == 0.25
  assert test_util.map_pressure(str(maps), str(tmp_path / "absent")) == 0.0
  limit.write_text("many\n")
  assert test_util.map_pressure(str(maps), str(limit)) == 0.0


def _mappings() -> int:
  with open("/proc/self/maps") as f:
    return sum(1 for _ in f)


def test_a_compiled_program_takes_few_memory_mappings():
  """Test processes compile each program as one LLVM module (conftest's XLA_FLAGS): split for
  parallel code generation, as XLA does by default, this program took about 114 mappings; a
  worker holding several hundred programs then reached vm.max_map_count and aborted."""
  if not os.path.exists("/proc/self/maps"):
    return
  assert "--xla_cpu_parallel_codegen_split_count=1" in os.environ["XLA_FLAGS"]

  def loss(ws, x, c):
    for w in ws:
      x = jnp.tanh(x @ w) + jnp.sin(x) * c
      x = x / (1 + jnp.abs(x).sum(-1, keepdims=True))
    return (x ** 2).mean()

  ws = [jnp.full((32, 32), 0.01 * (i + 1)) for i in range(6)]
  x = jnp.ones((4, 32))
  before = _mappings()
  grads = [jax.jit(jax.grad(lambda ws, x, c=c: loss(ws, x, c)))(ws, x) for c in (1.0, 2.0, 3.0)]
  jax.block_until_ready(grads)
  per_program = (_mappings() - before) / len(grads)
  assert per_program < 50, per_program
  assert np.isfinite(np.asarray(grads[0][0])).all()
