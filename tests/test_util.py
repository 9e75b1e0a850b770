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


def map_pressure(maps: str = "/proc/self/maps",
                 limit: str = "/proc/sys/vm/max_map_count") -> float:
  """This process's memory mappings as a share of the most the kernel allows it (0.0 where the
  system does not say: no /proc)."""
  try:
    with open(limit) as f:
      most = int(f.read())
    with open(maps) as f:
      return sum(1 for _ in f) / most
  except (OSError, ValueError):
    return 0.0


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


def small_plan_config(**fields):
  """The scratch config at a size the planner compiles in seconds: 8 prompts x 4, 32 new tokens,
  one minibatch and microbatch, no KL, scanned layers without remat, FSDP over every device;
  `fields` as section__field=value."""
  c = scratch.get_config()
  c.rl.prompts_per_step, c.rl.group_size, c.rl.max_new_tokens = 8, 4, 32
  c.rl.minibatches, c.rl.microbatches, c.rl.epochs = 1, 1, 1
  c.rl.kl_coef, c.rl.max_kl = 0.0, 0.0
  c.model.scan_layers, c.model.remat, c.model.lora_rank = True, "none", 0
  c.parallel.mesh_shape = (1, -1, 1)
  for key, value in fields.items():
    section, field = key.split("__")
    setattr(getattr(c, section), field, value)
  return c


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


def compiled_programs(*jitted) -> tuple:
  """How many programs each jitted function has compiled so far in this process."""
  return tuple(f._cache_size() for f in jitted)  # pylint: disable=protected-access


# The rewards f32[P, G] the learn-step tests train on: a group with a right and a wrong completion,
# an all-wrong group (no gradient), a mostly-right one and an all-right one (no gradient).
LEARN_REWARDS = np.array([[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 0, 1], [1, 1, 1, 1]], np.float32)

# The tiny model families of the model tests (Llama-style GQA, Qwen2's biases and untied head,
# Qwen3's q/k norms with one KV head), at one small size.
MODEL_BASE = dict(vocab_size=48, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
                  mlp_dim=48)
MODEL_VARIANTS = {
    "llama_gqa": dict(MODEL_BASE),
    "qwen2_bias_untied": dict(MODEL_BASE, qkv_bias=True, tie_embeddings=False, rope_theta=500.0),
    "qwen3_qknorm_mqa": dict(MODEL_BASE, qk_norm=True, num_kv_heads=1),
}


def variant_config(name: str, **overrides) -> ModelConfig:
  """The tiny ModelConfig of MODEL_VARIANTS[name] with `overrides`."""
  return ModelConfig.tiny(**{**MODEL_VARIANTS[name], **overrides})


def randomised_model(config: ModelConfig, seed: int = 0, std: float = 0.2):
  """(graphdef, params) of a model whose every parameter (norm scales and biases too) is random."""
  graphdef, params = transformer.init_model(config, seed)
  return graphdef, randomise(params, jax.random.key(seed + 100), std)


def randomise(params, key, std: float):
  """`params` with every leaf drawn anew: 1 + noise for norm scales, noise elsewhere."""
  from flax import nnx  # pylint: disable=import-outside-toplevel
  flat = dict(nnx.to_flat_state(params))
  for i, (path, var) in enumerate(sorted(flat.items(), key=lambda kv: str(kv[0]))):
    noise = std * jax.random.normal(jax.random.fold_in(key, i), var[...].shape)
    value = 1.0 + noise if path[-1] == "scale" else noise
    flat[path] = var.replace(value.astype(var[...].dtype))
  return nnx.from_flat_state(flat)


def left_padded_batch(seed: int, vocab: int, lengths, width: int):
  """tokens i32[B, width] (garbage in the padding), mask bool[B, width], right-aligned rows."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab, size=(len(lengths), width)).astype(np.int32)
  mask = np.zeros((len(lengths), width), bool)
  for b, n in enumerate(lengths):
    mask[b, width - n:] = True
  return tokens, mask


def engine_model_config(scan: bool, vocab: int = 64) -> ModelConfig:
  """The rollout engines' tests' model: two layers, large enough to draw varied tokens."""
  return ModelConfig.tiny(vocab_size=vocab, d_model=64, num_layers=2, num_heads=4,
                          num_kv_heads=2, mlp_dim=128, init_std=0.3, scan_layers=scan)


def logprob_batch(b: int = 4, t: int = 6, seed: int = 0, spread: float = 0.3):
  """(logp f32[b, t], logp_old, advantages, mask) of the loss tests: logp spread around logp_old,
  ragged masks and (b > 2) an absent completion slot."""
  rng = np.random.default_rng(seed)
  logp_old = -rng.random((b, t)).astype(np.float32) * 3
  logp = (logp_old + spread * rng.normal(size=(b, t))).astype(np.float32)
  adv = rng.normal(size=(b, t)).astype(np.float32)
  mask = np.ones((b, t), np.float32)
  mask[0, 4:] = 0
  mask[1, 1:] = 0
  if b > 2:
    mask[2] = 0  # an absent completion slot
  return logp, logp_old, adv, mask


def scratch_config(**fields):
  """configs/scratch.py's config with fields set ("section__field", as `set_fields`)."""
  return set_fields(scratch.get_config(), **fields)


def toy_rl_config(steps: int, **rl):
  """configs/toy.py for `steps` RL steps at a learning rate large enough for a few updates to move
  the policy visibly, evaluated and saved at the start and the end only, with config.rl fields
  set by name."""
  from configs import toy  # pylint: disable=import-outside-toplevel
  c = toy.get_config()
  c.rl.steps = steps
  c.rl.learning_rate = 1e-3
  c.eval.every = 100
  c.checkpoint.every = 100
  for name, value in rl.items():
    c.rl[name] = value
  return c


def arm_pool(k: int, per_arm: int = 4):
  """A PromptPool of `k` arms with `per_arm` prompts each."""
  from rl_curriculum.curriculum import PromptPool  # pylint: disable=import-outside-toplevel
  return PromptPool.from_arms(np.repeat(np.arange(k), per_arm))


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
