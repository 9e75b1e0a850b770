"""Applies the mutations of `mutations.py` one at a time and records which tests catch each.

  python tests/mutations/run.py --repo DIR --list
  nice -n 15 python tests/mutations/run.py --repo DIR [--only ID,ID] [--out FILE] [--workers N]

DIR is a clean git checkout (no tracked changes) that nothing else edits: every mutation is
written into its files. The run first runs the union of the selections unmutated and stops if
any test fails there. Then, for each mutation, it replaces the text, runs
`python -m pytest -q -p no:cacheprovider -n N` on the mutation's selection from DIR (every test of
the selection, no -x), and restores the file, checking `git -C DIR diff --quiet` afterwards.

The result, written to FILE as JSON, is {id: {"failed": [node ids], "exit_code": int,
"seconds": float, "caught": bool}}; a table with one line per mutation is printed. A mutation is
caught when pytest exits 1 (tests failed) or 2 (collection or fixture errors), or runs past
--timeout. Exit status: 0 when every mutation is caught, 1 otherwise, 2 on a setup error.

This file is also the pytest plugin (`-p run`) that writes the failed node ids to the file named
by $MUTATION_FAILURES.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from mutations import MUTATIONS  # pylint: disable=wrong-import-position

_FAILED = set()


# --- pytest plugin: collect failing node ids in the controller process ---------------------------

def pytest_runtest_logreport(report):
  if report.failed:
    _FAILED.add(report.nodeid)


def pytest_collectreport(report):
  if report.failed:
    _FAILED.add(report.nodeid or "<collection>")


def pytest_sessionfinish(session):
  path = os.environ.get("MUTATION_FAILURES")
  if path and not hasattr(session.config, "workerinput"):  # xdist workers report to the controller
    with open(path, "w") as f:
      json.dump(sorted(_FAILED), f)


# --- the runner ---------------------------------------------------------------------------------

def run_pytest(repo, selection, workers, timeout):
  """(failed node ids, exit code, seconds) of pytest on `selection` in `repo`; exit code None and
  failed ["TIMEOUT"] when it runs past `timeout` seconds."""
  with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
    failures = f.name
  env = dict(os.environ, MUTATION_FAILURES=failures, PYTHONDONTWRITEBYTECODE="1",
             PYTHONPATH=os.pathsep.join([repo, HERE, os.environ.get("PYTHONPATH", "")]))
  cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "run",
         "-n", str(workers), *selection]
  start = time.time()
  try:
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True,
                          timeout=timeout)
    code = proc.returncode
    with open(failures) as f:
      failed = json.load(f) if os.path.getsize(failures) else []
    if code not in (0, 1):
      print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n", file=sys.stderr)
  except subprocess.TimeoutExpired:
    code, failed = None, ["TIMEOUT"]
  finally:
    os.unlink(failures)
  return failed, code, round(time.time() - start, 1)


def read_checked(repo, mutation):
  """The original bytes of the mutation's file; exits unless `old` occurs there exactly once."""
  with open(os.path.join(repo, mutation.file), "rb") as f:
    original = f.read()
  count = original.decode("utf-8").count(mutation.old)
  if count != 1:
    raise SystemExit(f"mutation {mutation.id}: the old text occurs {count} times in "
                     f"{mutation.file} (expected exactly once); fix mutations.py")
  return original


def apply(repo, mutation):
  """Writes the mutation into its file; returns the file's original bytes."""
  original = read_checked(repo, mutation)
  with open(os.path.join(repo, mutation.file), "wb") as f:
    f.write(original.decode("utf-8").replace(mutation.old, mutation.new).encode("utf-8"))
  return original


def restore(repo, mutation, original):
  with open(os.path.join(repo, mutation.file), "wb") as f:
    f.write(original)
  if subprocess.run(["git", "-C", repo, "diff", "--quiet"]).returncode != 0:
    raise SystemExit(f"{repo} still differs from its commit after restoring {mutation.file}")


def union(selections):
  """The selections' entries, once each; a node id is dropped when its whole file is selected."""
  entries = list(dict.fromkeys(e for sel in selections for e in sel))
  files = {e for e in entries if "::" not in e}
  return [e for e in entries if "::" not in e or e.split("::")[0] not in files]


def table_line(m, r):
  shown = ", ".join(r["failed"][:3]) + (f" (+{len(r['failed']) - 3})" if len(r["failed"]) > 3
                                         else "")
  return (f"{m.id:28} {'caught' if r['caught'] else 'MISSED':7} {r['seconds']:7.1f}s  "
          f"{len(r['failed']):3} failed  {shown}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("--repo", required=True, help="clean checkout to mutate")
  parser.add_argument("--only", default="", help="comma-separated mutation ids")
  parser.add_argument("--out", default="", help="JSON file for the results")
  parser.add_argument("--workers", type=int, default=1, help="pytest -n")
  parser.add_argument("--timeout", type=float, default=1800, help="seconds per pytest run")
  parser.add_argument("--list", action="store_true", help="print the mutations and stop")
  args = parser.parse_args()
  repo = os.path.abspath(args.repo)
  chosen = [m for m in MUTATIONS if not args.only or m.id in args.only.split(",")]
  unknown = set(filter(None, args.only.split(","))) - {m.id for m in MUTATIONS}
  if unknown or not chosen:
    raise SystemExit(f"unknown mutation ids {sorted(unknown)}; see --list")
  for m in chosen:
    read_checked(repo, m)
  if args.list:
    for m in chosen:
      print(f"{m.id:28} {m.file:36} {m.breaks}\n{'':28} tests: {' '.join(m.tests)}")
    return 0
  if subprocess.run(["git", "-C", repo, "diff", "--quiet", "HEAD"]).returncode != 0:
    raise SystemExit(f"{repo} has uncommitted changes to tracked files; use a clean checkout")

  started = time.time()
  selection = union(m.tests for m in chosen)
  failed, code, seconds = run_pytest(repo, selection, args.workers, args.timeout)
  print(f"unmutated: exit {code}, {seconds:.1f}s, {len(failed)} failed", flush=True)
  if code != 0:
    print("\n".join(failed), file=sys.stderr)
    raise SystemExit(2)

  results = {}
  for m in chosen:
    original = apply(repo, m)
    try:
      failed, code, seconds = run_pytest(repo, list(m.tests), args.workers, args.timeout)
    finally:
      restore(repo, m, original)
    results[m.id] = {"failed": failed, "exit_code": code, "seconds": seconds,
                     "caught": code in (1, 2, None)}
    print(table_line(m, results[m.id]), flush=True)
    if args.out:  # written after every mutation, so an interrupted run keeps what it measured
      with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
  missed = [i for i, r in results.items() if not r["caught"]]
  print(f"{len(results) - len(missed)}/{len(results)} caught in {time.time() - started:.0f}s"
        + (f"; missed: {', '.join(missed)}" if missed else ""))
  return 1 if missed else 0


if __name__ == "__main__":
  sys.exit(main())
