"""A workdir one run owns: a lock against a second writer, and the config its checkpoints belong to.

  with workdir.Lock(path):                    # WorkdirBusy when another process holds it
    changes = workdir.check_config(config, path, allow_changes=False)   # ConfigChanged
    workdir.record_config(config, path)

A second process started on a workdir that a run is writing would interleave its checkpoints and
metrics with the first one's; `Lock` makes it stop at once, naming the holder. The lock is an
advisory `flock` on workdir/run.lock, which the kernel releases when its holder dies however it
dies, so a lock left by a killed run is taken over without a word; the file records the holder's
pid, host and start time for the message.

A run resumed with a different config would continue a trajectory made under other settings, and
silently mix the two. `check_config` compares the config with the one recorded in
workdir/config.json when the workdir holds RL checkpoints; fields in `SAFE_TO_CHANGE` (how long
to run, how often to evaluate and save, where the processes meet) may differ, any other
difference stops the run with one line naming the fields, unless the caller allows it, in which
case the changes are returned for the log (`train_and_evaluate` writes them into metrics.jsonl
at the step they take effect).
"""

import fcntl
import json
import os
import socket
import time
import ml_collections

from rl_curriculum.train.setup import warm_start
from rl_curriculum.train.setup.validation import ConfigError

__all__ = ["LOCK", "CONFIG", "SAFE_TO_CHANGE", "WorkdirBusy", "ConfigChanged", "Lock",
           "config_changes", "check_config", "record_config", "describe_changes"]

LOCK = "run.lock"       # held by the process that writes the workdir
CONFIG = "config.json"  # the config of the run the workdir's checkpoints belong to

# Fields a resumed run may change: they decide how long the run goes on, how often it evaluates
# and saves, how much of the held-out sets it batches at once, and how its processes find each
# other, never what a training step computes.
SAFE_TO_CHANGE = frozenset({
    "rl.steps", "eval.every", "eval.batch_size", "eval.min_held_out", "eval.plan_bound",
    "checkpoint.every", "checkpoint.keep", "parallel.coordinator_address", "parallel.process_id",
    "parallel.check_replicated"})


class WorkdirBusy(RuntimeError):
  """Another process holds the workdir's lock; the message names it."""


class ConfigChanged(ConfigError):
  """A resumed run's config differs from its workdir's in fields that change training."""


class Lock:
  """An exclusive lock on workdir/run.lock for as long as the `with` block runs (creating the
  workdir if needed). `enabled=False` (processes other than 0 of a multi-process run, which
  share process 0's workdir) takes no lock.

  Raises (on entering):
    WorkdirBusy: another process holds it; the message gives that process's pid, host and start.
  """

  def __init__(self, workdir: str, enabled: bool = True):
    self.path = os.path.join(workdir, LOCK)
    self.enabled = enabled
    self._file = None

  def __enter__(self):
    if not self.enabled:
      return self
    os.makedirs(os.path.dirname(self.path), exist_ok=True)
    f = open(self.path, "a+")  # pylint: disable=consider-using-with
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      holder = _read_holder(f)
      f.close()
      raise WorkdirBusy(f"{os.path.dirname(self.path)} is in use by {holder}: wait for it to "
                        "finish or stop it, or use another --workdir") from None
    f.seek(0)
    f.truncate()
    f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                        "since": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n")
    f.flush()
    self._file = f
    return self

  def __exit__(self, *exc):
    if self._file is not None:
      fcntl.flock(self._file, fcntl.LOCK_UN)
      self._file.close()
      self._file = None


def _read_holder(f) -> str:
  f.seek(0)
  try:
    holder = json.loads(f.read())
    return f"pid {holder['pid']} on {holder['host']} (since {holder['since']})"
  except (ValueError, KeyError, TypeError):
    return "another process"


def _flat(tree: dict, prefix: str = "") -> dict:
  """{"rl.learning_rate": 1e-5, ...} of a nested config dict (JSON values: tuples as lists)."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict) and not (prefix == "curriculum." and key == "options"):
      out.update(_flat(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def _as_json(config: ml_collections.ConfigDict) -> dict:
  return json.loads(config.to_json())


def config_changes(recorded: dict, config: ml_collections.ConfigDict) -> dict:
  """{field: (recorded value, new value)} of the fields outside `SAFE_TO_CHANGE` that differ
  (a field one side lacks counts as changed; `curriculum.options` is one field)."""
  old, new = _flat(recorded), _flat(_as_json(config))
  return {k: (old.get(k, "absent"), new.get(k, "absent")) for k in sorted(set(old) | set(new))
          if k not in SAFE_TO_CHANGE and old.get(k, "absent") != new.get(k, "absent")}


def describe_changes(changes: dict) -> str:
  """"rl.learning_rate: 1e-05 -> 0.001, ..." of `config_changes`."""
  return ", ".join(f"{k}: {json.dumps(a)} -> {json.dumps(b)}" for k, (a, b) in changes.items())


def _has_checkpoint(workdir: str) -> bool:
  folder = os.path.join(workdir, "checkpoints")
  return os.path.isdir(folder) and any(d.isdigit() for d in os.listdir(folder))


def check_config(config: ml_collections.ConfigDict, workdir: str, *,
                 allow_changes: bool = False) -> dict:
  """The changes of `config` against the config the workdir's RL checkpoints were made with
  ({} for a workdir without checkpoints or without a record).

  Raises:
    ConfigChanged: fields outside `SAFE_TO_CHANGE` differ and `allow_changes` is False, or a
      field behind the cached warm start differs (never allowed: use a fresh workdir).
  """
  path = os.path.join(workdir, CONFIG)
  if not (os.path.exists(path) and _has_checkpoint(workdir)):
    return {}
  with open(path) as f:
    changes = config_changes(json.load(f), config)
  if not changes:
    return {}
  # The fields behind the cached tokenizer and SFT warm start: no flag can change them here.
  fixed = [k for k in changes if k in _flat(json.loads(json.dumps(
      warm_start.fingerprint(config), default=str)))]
  head = (f"{workdir} holds a run made with other settings ({path}): {describe_changes(changes)}"
          "; ")
  if fixed:
    raise ConfigChanged(f"{head}{', '.join(fixed)} made its tokenizer and SFT warm start: use a "
                        "fresh --workdir")
  if not allow_changes:
    raise ConfigChanged(f"{head}resume with the same config, use a fresh --workdir, or pass "
                        "--allow_config_change to go on with the new values (the change is "
                        "logged in metrics.jsonl)")
  return changes


def record_config(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Writes `config` to workdir/config.json (atomically: a killed write leaves the old one)."""
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, CONFIG)
  with open(path + ".tmp", "w") as f:
    f.write(config.to_json(indent=1))
  os.replace(path + ".tmp", path)
