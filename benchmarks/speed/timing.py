"""Timing helpers shared by every stage of the benchmark."""

import json
import os
import statistics
import time


def log(text: str) -> None:
  """Prints a progress line with the wall-clock time."""
  print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def timed(fn, repeats: int):
  """Calls `fn` once to warm up (and compile), then `repeats` times.

  Returns:
    (median seconds of the timed calls, seconds of the first call, result of the last call).
  """
  t0 = time.perf_counter()
  out = fn()
  first = time.perf_counter() - t0
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times), first, out


def rates(b: int, tp: int, n: int, prefill_s: float, decode_s: float) -> dict:
  """Token rates of sampling N new tokens after a prompt of Tp tokens, for B rows."""
  return {"prefill_tok_s": b * tp / prefill_s, "decode_tok_s": b * n / decode_s,
          "new_tok_s": b * n / (prefill_s + decode_s), "prefill_s": prefill_s,
          "decode_s": decode_s, "seconds": prefill_s + decode_s}


def write_results(out_dir: str, name: str, results: dict, text: str) -> str:
  """Writes OUT_DIR/NAME.json (`results`) and OUT_DIR/NAME.md (`text`); prints the markdown and
  returns the path stem."""
  os.makedirs(out_dir, exist_ok=True)
  stem = os.path.join(out_dir, name)
  with open(stem + ".json", "w") as f:
    json.dump(results, f, indent=1)
  with open(stem + ".md", "w") as f:
    f.write(text)
  print(text)
  return stem
