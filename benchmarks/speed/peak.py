"""The machine: environment, float32 matmul peak, and releasing memory between stages."""

import ctypes
import datetime
import gc
import importlib.metadata
import os
import platform
import sys
import time

import jax
import jax.numpy as jnp

from benchmarks.speed import timing


def environment() -> dict:
  """CPU, affinity, thread counts and package versions."""
  info = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
          "python": platform.python_version(), "jax": jax.__version__,
          "jax_backend": jax.default_backend(), "cpu_count": os.cpu_count(),
          "affinity": sorted(os.sched_getaffinity(0)),
          "xla_flags": os.environ.get("XLA_FLAGS", "")}
  try:
    with open("/proc/cpuinfo") as f:
      names = [l.split(":", 1)[1].strip() for l in f if l.startswith("model name")]
    info["cpu_model"] = names[0] if names else platform.processor()
  except OSError:
    info["cpu_model"] = platform.processor()
  # The peers' packages are optional (the `bench` extra): record None where one is missing. Read
  # from the installed metadata: importing torch and transformers only for their versions would
  # take seconds of every benchmark that never runs a peer.
  for name in ("torch", "transformers", "trl", "peft", "flax", "optax"):
    try:
      info[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      info[name] = None
  if "torch" in sys.modules:  # already imported (suite.run records the peers' own thread count)
    info["torch_threads"] = sys.modules["torch"].get_num_threads()
  return info


def quick_peak(n: int = 1024, repeats: int = 3) -> float:
  """GFLOP/s of the best of `repeats` jnp.dot calls on n x n float32 matrices."""
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
  dot = jax.jit(jnp.dot)
  jax.block_until_ready(dot(a, a))
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(dot(a, a))
    best = min(best, time.perf_counter() - t0)
  return 2 * n ** 3 / best / 1e9


def matmul_peak(sizes, repeats: int) -> dict:
  """Best dense float32 matmul rate, GFLOP/s = 2 n^3 / seconds / 1e9, for jax and torch."""
  out = {"sizes": list(sizes), "jax": {}, "torch": {}}
  dot = jax.jit(jnp.dot)
  for n in sizes:
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
    seconds, _, _ = timing.timed(lambda: jax.block_until_ready(dot(a, b)), max(repeats, 3))
    out["jax"][str(n)] = 2 * n ** 3 / seconds / 1e9
  try:
    # torch is optional (the `bench` extra); without it only the jax peak is reported.
    import torch  # pylint: disable=import-outside-toplevel
    for n in sizes:
      a, b = torch.randn(n, n), torch.randn(n, n)
      seconds, _, _ = timing.timed(lambda: torch.matmul(a, b), max(repeats, 3))
      out["torch"][str(n)] = 2 * n ** 3 / seconds / 1e9
  except ImportError:
    pass
  out["jax_best"] = max(out["jax"].values())
  out["torch_best"] = max(out["torch"].values()) if out["torch"] else None
  return out


def release_memory() -> None:
  """Drops compiled programs and returns freed heap pages to the OS between stages.

  A SmolLM2 run that kept TRL's freed torch buffers and every compiled program (13.5 GB resident)
  was killed for memory while the Tunix peer ran beside it.
  """
  gc.collect()
  jax.clear_caches()
  try:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
  except (OSError, AttributeError):
    pass
