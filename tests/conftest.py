"""Test set-up shared by the whole suite.

Compile once, train once. A test run creates one temporary folder (`RL_CURRICULUM_TEST_SHARED`)
that its xdist workers and the processes tests start inherit through the environment, and removes
it at the end, so nothing carries over from one run to the next (a cold CI run is what is
measured). It holds

  jax_cache/     JAX's persistent compilation cache: a program compiled by one worker or
                 subprocess is loaded, not compiled again, by every other (the tests share one
                 tiny model and one batch shape so that their programs are alike);
  warm_starts/   the tokenizer and SFT warm start of each config fingerprint the tests train
                 from, made once and copied into the workdirs that need it
                 (`test_util.shared_warm_start`).
"""

import os
import shutil
import tempfile

# Test processes compile with LLVM's cheap passes and XLA's older element-wise emitter instead of
# its fusion emitters: a third of the compile time, which is most of the suite's time, for the
# same programs (XLA's CPU code has no fast-math either way; every tolerance holds). And each
# program as one LLVM module, not split for parallel code generation: a split program's code
# takes about 114 memory mappings, an unsplit one about 21, and a worker that keeps several
# hundred programs alive otherwise reaches the kernel's limit of mappings (vm.max_map_count,
# 65,530 by default), after which LLVM cannot allocate and the worker aborts. Set before JAX
# starts, and inherited by the processes tests start.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 "
                                   "--xla_llvm_disable_expensive_passes=true "
                                   "--xla_cpu_use_fusion_emitters=false "
                                   "--xla_cpu_parallel_codegen_split_count=1")

import jax  # pylint: disable=wrong-import-position
import pytest  # pylint: disable=wrong-import-position

import test_util  # pylint: disable=wrong-import-position

# Programs that compile faster than this are not worth a cache file.
_MIN_COMPILE_S = 0.2
_CREATED = pytest.StashKey[str]()
# Past this share of the kernel's limit of memory mappings, a process drops its compiled programs
# between test files (`test_util.map_pressure`).
_MAP_SHARE = 0.35


def pytest_configure(config):
  if test_util.SHARED not in os.environ:  # the first process of the run (xdist's controller)
    os.environ[test_util.SHARED] = tempfile.mkdtemp(prefix="rl_curriculum_tests_")
    config.stash[_CREATED] = os.environ[test_util.SHARED]
  cache = os.path.join(os.environ[test_util.SHARED], "jax_cache")
  # Subprocesses read these when they import JAX; this process is configured directly.
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", cache)
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", str(_MIN_COMPILE_S))
  jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
  jax.config.update("jax_persistent_cache_min_compile_time_secs",
                    float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))
  # Implicit rank promotion hides shape bugs; every kernel must be explicit about broadcasting.
  jax.config.update("jax_numpy_rank_promotion", "raise")
  jax.config.update("jax_default_matmul_precision", "highest")


def pytest_unconfigure(config):
  created = config.stash.get(_CREATED, None)
  if created:
    os.environ.pop(test_util.SHARED, None)
    shutil.rmtree(created, ignore_errors=True)


def pytest_runtest_teardown(item, nextitem):
  """After a test file's last test: if this process holds more than `_MAP_SHARE` of the memory
  mappings the kernel allows (most of them compiled programs' code), drop JAX's caches of
  compiled programs, so a long-lived worker never reaches the limit; the next file compiles its
  programs again, or loads them from the persistent cache."""
  if nextitem is not None and nextitem.path == item.path:
    return
  if test_util.map_pressure() > _MAP_SHARE:
    jax.clear_caches()
