"""Helpers shared by the test files: tolerances, the jit/no-jit parametrization, feedback batches,
the learn step's tiny model and static config, and end-to-end runs that share a warm start.

Test files import it as `import test_util` (pyproject.toml's pytest `pythonpath` puts tests/ on
sys.path).
"""

import dataclasses
import fcntl
import functools
import hashlib
import json
import os
import shutil
import tempfile
from typing import Callable, Optional

import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import scratch
from rl_curriculum.model import transformer
from rl_curriculum.model.config import ModelConfig
from rl_curriculum.train.learn import rl_step
from rl_curriculum.train.learn.rl_types import LearnConfig
from rl_curriculum.train.setup import builders, warm_start
from rl_curriculum.types import Feedback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Wall-clock measurements differ between runs by nature; everything else must match exactly.
TIMING = ("time/", "tokens_per_s")

# Tolerance of float32 kernels checked against float64 references.
TOL = dict(rtol=1e-5, atol=1e-5)
# Every kernel test runs eagerly and under jit.
JIT = pytest.mark.parametrize("use_jit", [False, True], ids=["nojit", "jit"])
# Property tests: reproducible (derandomized), no per-example deadline (first calls compile).
SETTINGS = hypothesis.settings(max_examples=50, deadline=None, derandomize=True)


def maybe_jit(fn: Callable, use_jit: bool, **kwargs) -> Callable:
  """`fn` with `kwargs` bound (as static values), jitted when `use_jit`."""
  fn = functools.partial(fn, **kwargs)
  return jax.jit(fn) if use_jit else fn


# The folder a test run shares between its processes (conftest.py).
SHARED = "RL_CURRICULUM_TEST_SHARED"

# The learn step's unit tests share one tiny model and one batch shape, so that the programs they
# compile are alike across test files (and the compilation cache serves them): P prompts x G
# completions, prompts of TP tokens, completions of T tokens, a vocabulary of V.
P, G, TP, T, V = 4, 4, 5, 3, 16


def tiny_model(dtype: str = "float32"):
  """(graphdef, params) of a one-layer transformer over the V-token vocabulary, seed 0."""
  config = ModelConfig.tiny(vocab_size=V, d_model=32, num_layers=1, num_heads=2, num_kv_heads=1,
                            mlp_dim=64, dtype=dtype)
  return transformer.init_model(config, seed=0)


def learn_config(**overrides) -> LearnConfig:
  """The scratch config's learn config at the shared sizes: two minibatches, Clip-Higher off
  (eps_high 0.2), no ratio guard, no rollback on KL, completions of T tokens; `overrides` set
  any field."""
  base = builders.learn_config(scratch.get_config())
  small = dict(minibatches=2, eps_high=0.2, ratio_guard=0.0, max_kl=None, max_tokens=T)
  return dataclasses.replace(base, **{**small, **overrides})


def make_learn(graphdef, optimizer, curriculum, config, *, use_lora: bool = False, **kwargs):
  """`rl_step.make_learn` for one optimizer, curriculum and learn config, called as the tests call
  it: fn(train_state, cur_state, batch, key, frozen, ref) (`fn.jitted`: the jitted function of
  seven arguments, `config` last). `kwargs`: make_learn's out_shardings and mesh."""
  jitted = rl_step.make_learn(graphdef=graphdef, optimizer=lambda _: optimizer,
                              curriculum_update=lambda state, fb, _: curriculum.update(state, fb),
                              use_lora=use_lora, **kwargs)
  fn = lambda *args: jitted(*args, config)
  fn.jitted = jitted
  return fn


def feedback(correct=None, *, rewards=None, ids=None, arms=None, advantages=None,
             valid=None) -> Feedback:
  """A `Feedback` of P prompts x G completions from whichever fields a test cares about.

  Give `correct` (bool[P, G]) or `rewards` (f32[P, G]), or both. Left out: rewards = correct as
  0/1, correct = rewards > 0.5, prompt ids 0..P-1, arms all 0, advantages all 0, valid None (every
  completion valid).
  """
  if correct is None and rewards is None:
    raise ValueError("give correct or rewards")
  if rewards is None:
    rewards = np.asarray(correct, np.float32)
  rewards = jnp.asarray(rewards, jnp.float32)
  if correct is None:
    correct = rewards > 0.5
  p = rewards.shape[0]
  return Feedback(
      prompt_ids=jnp.arange(p, dtype=jnp.int32) if ids is None else jnp.asarray(ids, jnp.int32),
      arms=jnp.zeros(p, jnp.int32) if arms is None else jnp.asarray(arms, jnp.int32),
      rewards=rewards, correct=jnp.asarray(correct, bool),
      advantages=(jnp.zeros(rewards.shape, jnp.float32) if advantages is None
                  else jnp.asarray(advantages, jnp.float32)),
      valid=None if valid is None else jnp.asarray(valid, bool))


def fast_first(values: list) -> list:
  """pytest parameters of `values`: the first runs in `make test-fast`, the others are marked
  slow (variants of a case whose first already exercises the same code and compiles). A tuple
  value fills several argument names."""
  def param(value, marks=()):
    return pytest.param(*value if isinstance(value, tuple) else (value,), marks=marks)
  return [param(v, () if i == 0 else pytest.mark.slow) for i, v in enumerate(values)]


def set_fields(config, **fields):
  """`config` with fields set by name, "section__field" for config.section.field (the ConfigDict
  is changed in place and returned)."""
  for path, value in fields.items():
    section, name = path.split("__")
    config[section][name] = value
  return config


def device_env(devices: int, **extra) -> dict:
  """The environment of a subprocess that sees `devices` fake CPU devices, with the test run's
  XLA flags (conftest.py) and compilation cache, and `extra` variables set. The fake devices are
  threads of one process: on two busy cores one of them can reach a collective long after the
  others, so the time XLA lets them wait for each other (40 s by default, then it aborts the
  process) is raised to 15 minutes."""
  flags = " ".join([os.environ.get("XLA_FLAGS", ""),
                    f"--xla_force_host_platform_device_count={devices}",
                    "--xla_cpu_collective_call_warn_stuck_timeout_seconds=300",
                    "--xla_cpu_collective_call_terminate_timeout_seconds=900"])
  return {**os.environ, "XLA_FLAGS": flags.strip(), **extra}


def run_script(path: str, *args: str, devices: int = 8, timeout: int = 900):
  """Runs `python path args...` from the repository root in a subprocess that sees `devices`
  fake CPU devices (`device_env`); returns the CompletedProcess (text output captured)."""
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  return subprocess.run([sys.executable, path, *args], env=device_env(devices, PYTHONPATH=ROOT),
                        cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def shared_warm_start(config) -> str:
  """A workdir holding the tokenizer and SFT warm start of `config` (`warm_start.CACHES`), made
  once per test run for each `warm_start.fingerprint` and shared by every test and xdist worker:
  the first to ask builds it under a file lock, the others wait and reuse it. It lives in the
  run's shared folder (conftest.py), or in a fresh temporary folder outside a test run."""
  from rl_curriculum.train.setup import prepare  # pylint: disable=import-outside-toplevel
  if SHARED not in os.environ:
    os.environ[SHARED] = tempfile.mkdtemp(prefix="rl_curriculum_tests_")
  root = os.path.join(os.environ[SHARED], "warm_starts")
  os.makedirs(root, exist_ok=True)
  record = json.dumps(warm_start.fingerprint(config), sort_keys=True, default=str)
  folder = os.path.join(root, hashlib.sha256(record.encode()).hexdigest()[:16])
  with open(folder + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
    if not os.path.exists(os.path.join(folder, "ready")):
      shutil.rmtree(folder, ignore_errors=True)
      prepare.prepare(config, folder, log=lambda _: None)
      open(os.path.join(folder, "ready"), "w").close()
  return folder


def copy_warm_start(source: str, workdir: str) -> None:
  """Copies the tokenizer and SFT caches of workdir `source` into `workdir`, each one that
  `workdir` does not hold already (a resumed workdir keeps its own)."""
  os.makedirs(workdir, exist_ok=True)
  for name in warm_start.CACHES:
    path, target = os.path.join(source, name), os.path.join(workdir, name)
    if os.path.exists(target):
      continue
    copy = shutil.copytree if os.path.isdir(path) else shutil.copy
    copy(path, target)


def run_rl(config, workdir: str, warm_from: Optional[str] = "shared",
           allow_config_change: bool = False) -> list[dict]:
  """Rows of metrics.jsonl of the RL steps (step >= 1) of `loop.train_and_evaluate(config,
  workdir)`. The run starts from a copy of a tokenizer and SFT warm start made with the same
  task, model and SFT settings: by default the test run's shared one (`shared_warm_start`),
  else that of workdir `warm_from`; with `warm_from=None` it makes its own. A workdir holding
  checkpoints made with another config is resumed only with `allow_config_change`."""
  from rl_curriculum.train import loop  # pylint: disable=import-outside-toplevel
  from rl_curriculum.train.report.metrics import read_jsonl  # pylint: disable=import-outside-toplevel
  if warm_from == "shared":
    warm_from = shared_warm_start(config)
  if warm_from is not None:
    copy_warm_start(warm_from, workdir)
  loop.train_and_evaluate(config, workdir, allow_config_change=allow_config_change)
  rows = [r for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")) if r["step"] >= 1]
  assert [r["step"] for r in rows] == list(range(1, config.rl.steps + 1))
  return rows


def flip_bytes(step_dir: str) -> None:
  """Inverts every 7th byte of the largest data file of a checkpoint step (its "state" item)."""
  files = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(step_dir, "state")) for f in fs]
  path = max(files, key=os.path.getsize)
  with open(path, "r+b") as f:
    data = bytearray(f.read())
    data[::7] = bytes(b ^ 0xFF for b in data[::7])
    f.seek(0)
    f.write(data)


def deterministic(rows: list[dict]) -> list[dict]:
  """metrics.jsonl rows without their wall-clock measurements (`TIMING`)."""
  return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


def saved_state(workdir: str, step: Optional[int] = None) -> tuple[int, dict]:
  """(step, saved state) of checkpoint `step` of a run's workdir (None: the newest), read back
  as it was written."""
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  from rl_curriculum.train.durable import checkpointing  # pylint: disable=import-outside-toplevel
  manager = checkpointing.make_manager(os.path.join(workdir, "checkpoints"))
  step = manager.latest_step() if step is None else step
  restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  manager.close()
  return step, restored["state"]


def train_command(workdir: str, *overrides: str, config: str = "scratch") -> list[str]:
  """The command line of `python -m experiments.train` with configs/<config>.py in `workdir`."""
  import sys  # pylint: disable=import-outside-toplevel
  return [sys.executable, "-m", "experiments.train",
          "--config", os.path.join(ROOT, "configs", f"{config}.py"), "--workdir", workdir,
          *overrides]
