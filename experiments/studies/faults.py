"""Faults injected into a toy run, as a user meets them, and whether the workdir held.

  python -m experiments.studies.faults                # every case: about 17 minutes on 2 cores
  python -m experiments.studies.faults --kills=5      # fewer random kills
  python -m experiments.studies.faults --cases=bad_input,second_writer

Each case drives the trainer's command line (`python -m experiments.train --config
configs/toy.py`, 6 RL steps, a checkpoint every 2, the newest 2 kept) in a workdir of its own, and
judges what it left against an uninterrupted run of the same command: the newest checkpoint's
arrays bit for bit and every logged metric but wall-clock times. A case *held* when the run ended
as it should: equal to the uninterrupted run after the same command was run again, or refused with
one line (`error: ...`, no traceback) and the workdir untouched. Anything else, and any traceback
in any output, is *lost*. The cases:

  kill            SIGKILL at a random moment of a run (start-up, SFT restore, RL steps, saves)
  kill_in_save    SIGKILL inside a checkpoint write: Orbax's files half written, or the seal
  damage          the newest checkpoint damaged on disk (bytes flipped, a file cut short, the
                  manifest, the metadata or the seal missing, every checkpoint damaged)
  full_disk       the workdir on a tmpfs too small for the next checkpoint (RLIMIT_FSIZE where
                  no tmpfs can be mounted), then room made and the same command run again
  second_writer   a second run started on a workdir a first one is writing
  config_change   a resumed run with changed fields: refused, allowed and logged, safe fields
  bad_input       config values the run cannot use
  collapse        a learning rate that collapses the policy

It prints a table (case, tried, held, lost) and writes `--out_dir`/faults.json and faults.md.
"""

import dataclasses
import hashlib
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, Optional

from absl import app
from absl import flags
from absl import logging
import jax
import numpy as np
import orbax.checkpoint as ocp

from experiments import cli
from rl_curriculum.train.durable import checkpointing
from rl_curriculum.train.report.metrics import read_jsonl
from rl_curriculum.train.setup import warm_start

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = ("kill", "kill_in_save", "damage", "full_disk", "second_writer", "config_change",
         "bad_input", "collapse")
# The run every case starts: 6 RL steps, checkpoints at steps 2, 4 and 6, the newest 2 kept.
STEPS, EVERY = 6, 2
RUN_FLAGS = (f"--config.rl.steps={STEPS}", f"--config.checkpoint.every={EVERY}",
             "--config.checkpoint.keep=2")
_TIMING = ("time/", "tokens_per_s", "config_change")  # differ between equal runs by nature

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags; defined when it runs, so that importing this module defines none."""
  flags.DEFINE_string("out_dir", os.path.join(ROOT, "benchmarks", "results"),
                      "Where faults.json and faults.md go.")
  flags.DEFINE_string("work", "", "Folder for the cases' workdirs (default: a temporary one, "
                      "removed at the end).")
  flags.DEFINE_integer("kills", 20, "SIGKILLs at random moments.")
  flags.DEFINE_integer("seed", 0, "Seed of the random kill moments.")
  flags.DEFINE_list("cases", list(CASES), f"Cases to run, of {', '.join(CASES)}.")


@dataclasses.dataclass
class Result:
  case: str
  name: str
  held: bool
  detail: str


@dataclasses.dataclass
class Finished:
  rc: int
  out: str
  err: str

  @property
  def traceback(self) -> bool:
    return "Traceback" in self.out or "Traceback" in self.err

  @property
  def error_line(self) -> str:
    """The `error: ...` line of a refused run ("" unless there is exactly one, and last)."""
    lines = [l for l in self.err.splitlines() if l.strip()]
    errors = [l for l in lines if l.startswith("error: ")]
    return errors[0] if len(errors) == 1 and lines[-1] == errors[0] else ""


class Trainer:
  """Starts `experiments.train` on the toy config in a workdir, its output kept in `logs`."""

  def __init__(self, logs: str, env: dict):
    self.logs, self.env, self._n = logs, env, 0
    os.makedirs(logs, exist_ok=True)

  def command(self, workdir: str, *extra: str) -> list:
    return [sys.executable, "-m", "experiments.train", "--config", "configs/toy.py", "--workdir",
            workdir, *RUN_FLAGS, *extra]

  def start(self, workdir: str, *extra: str,
            preexec: Optional[Callable[[], None]] = None) -> subprocess.Popen:
    self._n += 1
    base = os.path.join(self.logs, f"{self._n:03d}_{os.path.basename(workdir)}")
    with open(base + ".out", "w") as out, open(base + ".err", "w") as err:
      proc = subprocess.Popen(self.command(workdir, *extra), stdout=out, stderr=err, cwd=ROOT,
                              env=self.env, preexec_fn=preexec)
    proc.log_files = (base + ".out", base + ".err")
    return proc

  @staticmethod
  def finish(proc: subprocess.Popen, timeout: float = 900) -> Finished:
    proc.wait(timeout)
    with open(proc.log_files[0]) as out, open(proc.log_files[1]) as err:
      return Finished(proc.returncode, out.read(), err.read())

  def run(self, workdir: str, *extra: str, **kwargs) -> Finished:
    return self.finish(self.start(workdir, *extra, **kwargs))


# ------------------------------------------------------------------------------------------------
# What a run left: its outcome, and its files.
# ------------------------------------------------------------------------------------------------

def outcome(workdir: str) -> tuple:
  """(newest checkpoint step, SHA-256 of its arrays, metrics rows without timings)."""
  manager = ocp.CheckpointManager(os.path.join(workdir, "checkpoints"),
                                  options=ocp.CheckpointManagerOptions(read_only=True),
                                  item_names=("state", "meta"))
  step = manager.latest_step()
  digest = hashlib.sha256()
  if step is not None:
    state = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    for leaf in jax.tree.leaves(state["state"]):
      digest.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
  manager.close()
  rows = [{k: v for k, v in r.items() if not k.startswith(_TIMING)}
          for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))]
  return step, digest.hexdigest(), rows


def files(workdir: str) -> dict:
  """{relative path: [size, SHA-256]} of every file in `workdir` but its lock."""
  return checkpointing.digests(workdir, skip=("run.lock",))


def copy_warm_start(source: str, workdir: str) -> str:
  """A fresh `workdir` holding the tokenizer and SFT warm start of workdir `source`."""
  shutil.rmtree(workdir, ignore_errors=True)
  os.makedirs(workdir)
  for name in warm_start.CACHES:
    path = os.path.join(source, name)
    (shutil.copytree if os.path.isdir(path) else shutil.copy)(path, os.path.join(workdir, name))
  return workdir


def same_as(reference: tuple, workdir: str, finished: Finished) -> tuple[bool, str]:
  """(held, detail) of a run that should have ended equal to the uninterrupted one."""
  if finished.rc != 0 or finished.traceback:
    return False, f"exit {finished.rc}{', traceback' if finished.traceback else ''}: " + (
        finished.err.strip().splitlines() or [""])[-1][:200]
  got = outcome(workdir)
  if got[0] != reference[0]:
    return False, f"newest checkpoint is step {got[0]}, not {reference[0]}"
  if got[1] != reference[1]:
    return False, f"step {got[0]}'s arrays differ from the uninterrupted run's"
  if got[2] != reference[2]:
    return False, "metrics.jsonl differs from the uninterrupted run's"
  return True, f"step {got[0]}, arrays and metrics equal to the uninterrupted run's"


def refused(finished: Finished, before: dict, workdir: str, rc: int,
            says: str) -> tuple[bool, str]:
  """(held, detail) of a run that should stop with exit `rc` and one error line containing
  `says`, leaving the workdir's files as `before`."""
  line = finished.error_line
  if finished.rc != rc or finished.traceback or says not in line:
    return False, (f"exit {finished.rc}{', traceback' if finished.traceback else ''}, "
                   f"stderr ends: {(finished.err.strip().splitlines() or [''])[-1][:200]}")
  after = files(workdir) if os.path.isdir(workdir) else {}
  if after != before:
    changed = sorted(k for k in set(after) | set(before) if after.get(k) != before.get(k))
    return False, f"refused but changed the workdir: {', '.join(changed[:3])}"
  return True, f"exit {rc}: {line}"


# ------------------------------------------------------------------------------------------------
# The cases.
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Setup:
  trainer: Trainer
  work: str
  base: str         # a finished run that made the warm start every case copies
  reference: tuple  # `outcome` of the uninterrupted run from a copied warm start (() if none)
  seconds: float    # that run's wall time
  kills: int        # SIGKILLs at random moments
  rng: random.Random


def _kill_at(setup: Setup, case: str, name: str,
             wait: Callable[[subprocess.Popen, str, int], str]) -> Result:
  """Starts a run, lets `wait` choose the moment (it returns what it saw), SIGKILLs the run,
  runs the same command again and compares. A run that finished before its moment came was not
  killed: it is tried again from scratch (`wait` is told the attempt), up to three times."""
  for attempt in range(3):
    workdir = copy_warm_start(setup.base, os.path.join(setup.work, name))
    proc = setup.trainer.start(workdir)
    seen = wait(proc, workdir, attempt)
    if proc.poll() is None:
      break
    if proc.returncode != 0:
      return Result(case, name, False, f"the run failed (exit {proc.returncode}) before the kill")
  else:
    return Result(case, name, False, "the run ended before the kill, three times")
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  held, detail = same_as(setup.reference, workdir, setup.trainer.run(workdir))
  return Result(case, name, held, f"killed {seen}; the same command again: {detail}")


def _last_step(workdir: str) -> int:
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  return rows[-1]["step"] if rows else -1


def kill(setup: Setup) -> list[Result]:
  """SIGKILLs at random moments: half drawn uniformly over the uninterrupted run's wall time
  (most of which, at this size, is start-up), half within the RL steps (after the row of a
  random step is logged, up to a second later)."""
  out = []
  for i in range(setup.kills):
    moment = setup.rng.uniform(0.3, 0.95 * setup.seconds)
    after, delay = setup.rng.randrange(STEPS), setup.rng.uniform(0.0, 1.0)

    def wait(proc, workdir, attempt, moment=moment, after=after, delay=delay,
             anywhere=i % 2 == 0):
      start = time.time()
      if anywhere:  # a moment past this run's end is drawn again, earlier
        while time.time() < start + moment * 0.6**attempt and proc.poll() is None:
          time.sleep(0.01)
      else:
        while proc.poll() is None and _last_step(workdir) < after:
          time.sleep(0.01)
        time.sleep(delay)
      return (f"{time.time() - start:.1f} s after the start (newest logged step "
              f"{_last_step(workdir)})")
    out.append(_kill_at(setup, "kill", f"kill_{i}", wait))
  return out


def _in_save(workdir: str, step: int, phase: str) -> bool:
  folder = os.path.join(workdir, "checkpoints")
  names = os.listdir(folder) if os.path.isdir(folder) else []
  if phase == "write":  # Orbax writes a step into a temporary folder, renamed when complete
    return any(n.startswith(f"{step}.") and "tmp" in n for n in names)
  return str(step) in names and not os.path.exists(os.path.join(folder, str(step),
                                                                "checksums.json"))


def kill_in_save(setup: Setup) -> list[Result]:
  """SIGKILLs the moment a checkpoint's files start to appear, or before its seal."""
  out = []
  for step, phase in ((2, "write"), (4, "write"), (2, "seal"), (4, "seal")):

    def wait(proc, workdir, attempt, step=step, phase=phase):
      del attempt
      while proc.poll() is None and not _in_save(workdir, step, phase):
        time.sleep(0.0005)
      return f"while {'writing' if phase == 'write' else 'sealing'} checkpoint {step}"
    out.append(_kill_at(setup, "kill_in_save", f"kill_in_save_{step}_{phase}", wait))
  return out


def _largest_file(step_dir: str) -> str:
  paths = [os.path.join(r, n) for r, _, ns in os.walk(os.path.join(step_dir, "state"))
           for n in ns]
  return max(paths, key=os.path.getsize)


def _flip(path: str, count: int = 4096) -> None:
  with open(path, "r+b") as f:
    data = bytearray(f.read())
    start = max(0, len(data) // 2 - count // 2)
    for i in range(start, min(len(data), start + count)):
      data[i] ^= 0xFF
    f.seek(0)
    f.write(data)


def _truncate(path: str) -> None:
  os.truncate(path, os.path.getsize(path) // 2)


DAMAGE = {  # name: (what it does to one step's folder, what the warning must say)
    "4096 bytes flipped in the largest data file": (lambda d: _flip(_largest_file(d)),
                                                    "checksum"),
    "the largest data file cut to half": (lambda d: _truncate(_largest_file(d)), "bytes"),
    "the manifest missing": (lambda d: os.remove(os.path.join(d, "state", "manifest.ocdbt")),
                             "missing"),
    "the metadata missing": (lambda d: os.remove(os.path.join(d, "state", "_METADATA")),
                             "missing"),
    "the seal missing (killed while sealing)": (
        lambda d: os.remove(os.path.join(d, "checksums.json")), "no checksum record"),
}


def damage(setup: Setup) -> list[Result]:
  out = []
  finished = os.path.join(setup.work, "reference")
  cases = [(name, (STEPS,), fn, says) for name, (fn, says) in DAMAGE.items()]
  cases.append(("every checkpoint's data flipped", (STEPS, STEPS - EVERY),
                DAMAGE["4096 bytes flipped in the largest data file"][0], "checksum"))
  for i, (name, steps, fn, says) in enumerate(cases):
    workdir = os.path.join(setup.work, f"damage_{i}")
    shutil.rmtree(workdir, ignore_errors=True)
    shutil.copytree(finished, workdir)
    for step in steps:
      fn(os.path.join(workdir, "checkpoints", str(step)))
    run = setup.trainer.run(workdir)
    held, detail = same_as(setup.reference, workdir, run)
    warned = [l for l in run.out.splitlines() if l.startswith("warning: checkpoint")]
    if held and (len(warned) != len(steps) or says not in warned[0]):
      held, detail = False, f"warnings {warned!r}"
    if held and not all(os.path.isdir(os.path.join(workdir, "checkpoints.damaged", str(s)))
                        for s in steps):
      held, detail = False, "the damaged step was not set aside"
    found = warned[0].partition(" is damaged: ")[2].partition(": passed over")[0] if held else ""
    out.append(Result("damage", name, held,
                      f"warned: checkpoint {steps[0]} is damaged: {found}; {detail}" if held
                      else detail))
  return out


def _mount_tmpfs(path: str, size: int) -> Optional[str]:
  """Mounts a tmpfs of `size` bytes at `path`; None, or why it could not."""
  os.makedirs(path, exist_ok=True)
  result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                          capture_output=True, text=True, check=False)
  return None if result.returncode == 0 else (result.stderr.strip() or "mount failed")


def _step_bytes(workdir: str, step: int) -> int:
  folder = os.path.join(workdir, "checkpoints", str(step))
  return sum(os.path.getsize(os.path.join(r, n)) for r, _, ns in os.walk(folder) for n in ns)


def full_disk(setup: Setup) -> list[Result]:
  """A disk with room for the warm start, the logs and one and a half checkpoints: the second
  checkpoint's write fails. The run must stop there with one line, its first checkpoint intact,
  and finish once room is made."""
  finished = os.path.join(setup.work, "reference")
  step_size = _step_bytes(finished, STEPS)
  rest = sum(os.path.getsize(os.path.join(r, n)) for r, _, ns in os.walk(finished) for n in ns
             if "checkpoints" not in r)
  mount = os.path.join(setup.work, "tmpfs")
  why = _mount_tmpfs(mount, rest + step_size * 3 // 2)
  workdir = copy_warm_start(setup.base, os.path.join(mount, "run"))
  if why is None:
    name, preexec = "tmpfs", None
  else:  # no tmpfs: files may not grow past half a checkpoint's largest file
    limit = os.path.getsize(_largest_file(os.path.join(finished, "checkpoints", str(STEPS)))) // 2
    name = f"RLIMIT_FSIZE of {limit} bytes ({why})"
    preexec = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
  try:
    run = setup.trainer.run(workdir, preexec=preexec)
    says = "could not write the checkpoint of step"
    held = run.rc == 1 and not run.traceback and says in run.error_line
    detail = (f"exit {run.rc}: {run.error_line}" if held else
              f"exit {run.rc}, stderr ends: {run.err.strip()[-300:]}")
    manager = checkpointing.make_manager(os.path.join(workdir, "checkpoints"))
    kept = manager.all_steps()
    intact = (bool(kept) or why is not None) and all(
        checkpointing.damage(os.path.join(workdir, "checkpoints", str(s))) is None for s in kept)
    manager.close()
    if held and not intact:
      held, detail = False, f"the kept checkpoints {kept} are not all intact"
    if why is None:
      subprocess.run(["mount", "-o", "remount,size=1g", mount], check=True)
    again_held, again = same_as(setup.reference, workdir,
                                setup.trainer.run(workdir))
    return [Result("full_disk", name, held and again_held,
                   f"{detail}; intact checkpoints kept: {kept}; with room made, the same "
                   f"command again: {again}")]
  finally:
    if why is None:
      subprocess.run(["umount", mount], check=False)


def second_writer(setup: Setup) -> list[Result]:
  workdir = copy_warm_start(setup.base, os.path.join(setup.work, "second_writer"))
  first = setup.trainer.start(workdir)
  while first.poll() is None and f'"pid": {first.pid},' not in _read(os.path.join(workdir,
                                                                                   "run.lock")):
    time.sleep(0.05)  # until the first holds the lock: 10-15 s before its RL steps end
  second = setup.trainer.run(workdir)
  held, detail = True, ""
  if second.rc != 2 or second.traceback or f"in use by pid {first.pid}" not in second.error_line:
    held, detail = False, f"the second run: exit {second.rc}, {second.err.strip()[-200:]}"
  ok, first_detail = same_as(setup.reference, workdir, setup.trainer.finish(first))
  return [Result("second_writer", "a second run on a workdir being written", held and ok,
                 detail or f"second run {second.error_line}; the first: {first_detail}")]


def _read(path: str) -> str:
  try:
    with open(path) as f:
      return f.read()
  except OSError:
    return ""


def config_change(setup: Setup) -> list[Result]:
  """Resumes of a run stopped at step 4 (rl.steps=4: a safe field) with other fields."""
  half = copy_warm_start(setup.base, os.path.join(setup.work, "half"))
  stopped = setup.trainer.run(half, "--config.rl.steps=4")
  if stopped.rc != 0:
    return [Result("config_change", "the run to resume", False, stopped.err[-300:])]
  other_curriculum = ("--config.curriculum.name=uniform", "--config.curriculum.options={}")
  cases = [
      ("rl.learning_rate changed", ("--config.rl.learning_rate=0.001",), 2, "rl.learning_rate"),
      ("the curriculum changed", other_curriculum, 2, "curriculum.name"),
      ("an SFT field changed, --allow_config_change", ("--config.sft.steps=20",
                                                       "--allow_config_change"), 2,
       "use a fresh --workdir"),
      ("the curriculum changed, --allow_config_change", (*other_curriculum,
                                                         "--allow_config_change"), 1,
       "another layout"),
  ]
  out = []
  for i, (name, extra, rc, says) in enumerate(cases):
    workdir = os.path.join(setup.work, f"config_{i}")
    shutil.rmtree(workdir, ignore_errors=True)
    shutil.copytree(half, workdir)
    before = files(workdir)
    out.append(Result("config_change", name,
                      *refused(setup.trainer.run(workdir, *extra), before, workdir, rc, says)))
  workdir = os.path.join(setup.work, "config_allowed")
  shutil.rmtree(workdir, ignore_errors=True)
  shutil.copytree(half, workdir)
  run = setup.trainer.run(workdir, "--config.rl.learning_rate=0.001", "--allow_config_change")
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  logged = [r.get("config_change", "") for r in rows]
  with open(os.path.join(workdir, "config.json")) as f:
    recorded = json.load(f)["rl"]["learning_rate"]
  held = (run.rc == 0 and not run.traceback and [r["step"] for r in rows] == list(range(7))
          and "rl.learning_rate" in logged[5] and not any(logged[:5] + logged[6:])
          and recorded == 0.001)
  seen = (f"exit {run.rc}; step 5 logs config_change={logged[5]!r}; config.json records "
          f"{recorded}" if len(logged) > 5 else f"exit {run.rc}: {run.err[-200:]}")
  out.append(Result("config_change", "rl.learning_rate changed, --allow_config_change", held,
                    seen))
  workdir = os.path.join(setup.work, "config_safe")
  shutil.rmtree(workdir, ignore_errors=True)
  shutil.copytree(half, workdir)
  out.append(Result("config_change", "rl.steps 4 -> 6 (a safe field)",
                    *same_as(setup.reference, workdir, setup.trainer.run(workdir))))
  return out


BAD_INPUT = (("--config.rl.nonexistent_field=1", "rl.nonexistent_field"),
             ("--config.rl.learning_rate=nan", "rl.learning_rate"),
             ("--config.tokenizer.vocab_size=0", "tokenizer.vocab_size"),
             ("--config.task.eval_bins=()", "task.eval_bins"),
             ("--config.rl.steps=many", "rl.steps"))


def bad_input(setup: Setup) -> list[Result]:
  out = []
  for i, (override, says) in enumerate(BAD_INPUT):
    workdir = os.path.join(setup.work, f"bad_{i}")
    shutil.rmtree(workdir, ignore_errors=True)
    out.append(Result("bad_input", override,
                      *refused(setup.trainer.run(workdir, override), {}, workdir, 2, says)))
  return out


def collapse(setup: Setup) -> list[Result]:
  workdir = copy_warm_start(setup.base, os.path.join(setup.work, "collapse"))
  run = setup.trainer.run(workdir, "--config.rl.learning_rate=1000.0",
                          "--config.checkpoint.on_collapse=stop")
  line = run.error_line
  held = run.rc == 1 and not run.traceback and "the policy collapsed" in line
  return [Result("collapse", "rl.learning_rate=1e3, checkpoint.on_collapse=stop", held,
                 f"exit {run.rc}: {line}" if line else run.err[-300:])]


# ------------------------------------------------------------------------------------------------
# The table.
# ------------------------------------------------------------------------------------------------

def table(results: list[Result]) -> str:
  """Markdown: one row per case (tried, held, lost), then one per result."""
  lines = ["| case | tried | held | lost |", "|---|---:|---:|---:|"]
  for case in dict.fromkeys(r.case for r in results):
    mine = [r for r in results if r.case == case]
    held = sum(r.held for r in mine)
    lines.append(f"| {case} | {len(mine)} | {held} | {len(mine) - held} |")
  held = sum(r.held for r in results)
  lines.append(f"| **all** | {len(results)} | {held} | {len(results) - held} |")
  lines += ["", "| case | what | held | what was seen |", "|---|---|---|---|"]
  lines += [f"| {r.case} | {r.name} | {'yes' if r.held else '**no**'} | "
            f"{r.detail.replace('|', '/')} |" for r in results]
  return "\n".join(lines)


def _setup(work: str, reference: bool, seed: int, kills: int) -> Setup:
  """The trainer, and with `reference` the warm start every case copies (made by a first run,
  which also fills the compilation cache) and the uninterrupted run from a copy of it."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "JAX_COMPILATION_CACHE_DIR": os.path.join(work, "jax_cache")}
  setup = Setup(trainer=Trainer(os.path.join(work, "logs"), env), work=work,
                base=os.path.join(work, "base"), reference=(), seconds=0.0, kills=kills,
                rng=random.Random(seed))
  if not reference:
    return setup
  shutil.rmtree(setup.base, ignore_errors=True)
  if setup.trainer.run(setup.base).rc == 0:
    workdir = copy_warm_start(setup.base, os.path.join(work, "reference"))
    t = time.time()
    if setup.trainer.run(workdir).rc == 0:
      return dataclasses.replace(setup, reference=outcome(workdir), seconds=time.time() - t)
  raise RuntimeError(f"the uninterrupted toy run failed: see {setup.trainer.logs}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  unknown = set(FLAGS.cases) - set(CASES)
  if unknown:
    raise app.UsageError(f"--cases: unknown {sorted(unknown)}; known: {', '.join(CASES)}")
  logging.set_verbosity(logging.ERROR)  # Orbax's INFO and WARNING lines while reading results
  work = FLAGS.work or tempfile.mkdtemp(prefix="rl_curriculum_faults_")
  t0 = time.time()
  setup = _setup(work, reference=bool(set(FLAGS.cases) - {"bad_input"}), seed=FLAGS.seed,
                 kills=FLAGS.kills)
  if setup.reference:
    print(f"uninterrupted run: {setup.seconds:.1f} s, newest checkpoint {setup.reference[0]}")
  results = []
  for case in CASES:
    if case in FLAGS.cases:
      t = time.time()
      results += globals()[case](setup)
      print(f"{case}: {time.time() - t:.0f} s")
  for r in results:  # paths relative to the work folder
    r.detail = r.detail.replace(os.path.join(work, ""), "")
  text = table(results)
  print(text)
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  report = {"seconds": time.time() - t0, "uninterrupted_run_s": setup.seconds,
            "seed": FLAGS.seed, "results": [dataclasses.asdict(r) for r in results]}
  with open(os.path.join(FLAGS.out_dir, "faults.json"), "w") as f:
    json.dump(report, f, indent=1)
  with open(os.path.join(FLAGS.out_dir, "faults.md"), "w") as f:
    f.write(f"# Faults injected into a toy run ({time.strftime('%Y-%m-%d')}, "
            f"{report['seconds'] / 60:.0f} minutes)\n\n"
            "`python -m experiments.studies.faults` (experiments/studies/faults.py says what "
            "each case does).\n\n"
            f"{text}\n")
  if not FLAGS.work:
    shutil.rmtree(work, ignore_errors=True)
  sys.exit(0 if all(r.held for r in results) else 1)


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=cli.parse_flags)
