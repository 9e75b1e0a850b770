"""Where the test suite's time goes: a pytest plugin, off unless asked for.

  .venv/bin/python -m pytest -p suite_timing -n 2 --dist loadfile tests

Around every test (its setup, call and teardown, so a module fixture counts towards the first test
that needs it) each worker measures the wall time and, within it, the seconds JAX spent tracing,
lowering and compiling (`jax.monitoring`'s compile events; a program loaded from the persistent
compilation cache counts as loading, not compiling), the seconds of SFT warm starts
(`sft.run_sft`, its compiling aside), and the CPU seconds of the processes the test started (`RUSAGE_CHILDREN`, which
counts a child once it has been waited for). At the end the controller prints one table, by
folder and for the ten slowest files, and writes the per-test records to $SUITE_TIMING_OUT
(default suite_timing.json).
"""

import collections
import glob
import json
import os
import resource
import time

import pytest

_KEY = pytest.StashKey[str]()     # where the records go
_TABLE = pytest.StashKey[str]()   # the table, printed in the terminal summary
_TOTALS = collections.Counter()   # this process's running sums, read around each test
_RECORDS = []
_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                   "/jax/core/compile/jaxpr_to_mlir_module_duration",
                   "/jax/core/compile/backend_compile_duration")


def _listen(event, seconds, **kwargs):
  del kwargs
  if event in _COMPILE_EVENTS:
    _TOTALS["compile"] += seconds


def pytest_configure(config):
  import jax  # pylint: disable=import-outside-toplevel
  from rl_curriculum.train.setup import sft  # pylint: disable=import-outside-toplevel
  jax.monitoring.register_event_duration_secs_listener(_listen)
  run_sft = sft.run_sft

  def timed_sft(*args, **kwargs):  # its compiling counts as compiling
    start, compiled = time.perf_counter(), _TOTALS["compile"]
    try:
      return run_sft(*args, **kwargs)
    finally:
      _TOTALS["sft"] += time.perf_counter() - start - (_TOTALS["compile"] - compiled)

  sft.run_sft = timed_sft
  config.stash[_KEY] = os.environ.get("SUITE_TIMING_OUT", "suite_timing.json")


def _children_cpu() -> float:
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  del nextitem
  before, children, start = dict(_TOTALS), _children_cpu(), time.perf_counter()
  yield
  _RECORDS.append({"test": item.nodeid, "wall": time.perf_counter() - start,
                   "compile": _TOTALS["compile"] - before.get("compile", 0.0),
                   "sft": _TOTALS["sft"] - before.get("sft", 0.0),
                   "children_cpu": _children_cpu() - children})


def pytest_sessionfinish(session):
  out = session.config.stash[_KEY]
  worker = getattr(session.config, "workerinput", None)
  if worker is not None:  # an xdist worker: its records, for the controller to merge
    with open(f"{out}.{worker['workerid']}", "w") as f:
      json.dump(_RECORDS, f)
    return
  records = list(_RECORDS)
  for part in sorted(glob.glob(out + ".gw*")):
    with open(part) as f:
      records += json.load(f)
    os.remove(part)
  with open(out, "w") as f:
    json.dump(records, f, indent=0)
  session.config.stash[_TABLE] = table(records)


def pytest_terminal_summary(terminalreporter, config):
  text = config.stash.get(_TABLE, None)
  if text:
    terminalreporter.write_sep("=", "where the suite's time goes (suite_timing)")
    terminalreporter.write_line(text)


def table(records: list[dict]) -> str:
  """A markdown table of the records' sums by folder, then the ten slowest files."""
  def row(name, group):
    s = {k: sum(r[k] for r in group) for k in ("wall", "compile", "sft", "children_cpu")}
    rest = s["wall"] - s["compile"] - s["sft"]
    return (f"| {name} | {len(group)} | {s['wall']:.0f} | {s['compile']:.0f} | {s['sft']:.0f} | "
            f"{rest:.0f} | {s['children_cpu']:.0f} |")

  by_folder, by_file = collections.defaultdict(list), collections.defaultdict(list)
  for r in records:
    path = r["test"].split("::")[0]
    by_folder[os.path.dirname(path) or "tests"].append(r)
    by_file[path].append(r)
  lines = ["| tests | count | wall s | compiling s | SFT s | the rest s | child processes, CPU s |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
  lines += [row(f"`{k}/`", v) for k, v in sorted(by_folder.items())]
  lines.append(row("**all**", records))
  slowest = sorted(by_file.items(), key=lambda kv: -sum(r["wall"] for r in kv[1]))[:10]
  lines += [row(f"`{k}`", v) for k, v in slowest]
  return "\n".join(lines)
