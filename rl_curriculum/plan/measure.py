"""One program compiled ahead of time and read: its memory per device, its largest buffers, its
cost with loops counted and its roofline time; a compiler's out-of-memory as a row, not an error.

  row, compiled = measure.measure(lambda: jitted.lower(*abstract_args), resident_bytes=...,
                                  chip=targets.CHIPS["v5e"], hbm_gib=15.75, trips=n_new)

Row fields (per device; GiB and seconds): argument, output, alias (outputs written into donated
inputs, counted once), temp (XLA's temporaries), resident (what the run keeps on the device
besides the program's arguments), peak = argument + output - alias + temp + resident, compile_s,
largest (the largest values of the optimised HLO), flops and bytes (`roofline.program_cost`, every
loop counted; a loop of unknown trip count runs `trips` times; a paged-attention kernel's
sequences attend over `kv_tokens` keys on average), unknown_kernels (TPU kernels not counted),
xla_flops (XLA's own count, each loop body once) and, for a TPU chip, bound_s
(`roofline.bound_s`). A program XLA:TPU refuses for
memory gives {"error": the compiler's line, "needs_gib": its temporaries, "peak_gib": the same}.
"""

import re
import time
from typing import Any, Callable, Optional

import jax
import numpy as np

from rl_curriculum.plan import roofline
from rl_curriculum.plan import targets

GIB = targets.GIB

_HLO_VALUE = re.compile(r"^\s*(?:ROOT\s+)?(%?[\w.\-]+) = ((?:f32|bf16|f16|s32|u32|pred|s8|u8)"
                        r"\[[\d,]*\])")
_ITEMSIZE = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "pred": 1, "s8": 1, "u8": 1}
_OOM = re.compile(r"required for HLO temporaries \(([\d.]+)([KMGT])\) exceeds available HBM "
                  r"\(([\d.]+)([KMGT])\)")
_UNIT = {"K": 2 ** -20, "M": 2 ** -10, "G": 1.0, "T": 2 ** 10}


def largest_values(hlo_text: str, top: int = 5) -> list:
  """The `top` largest array values the optimised (per-device) HLO computes, as
  "name f32[...] (X GiB)": the candidates for the largest temporaries (parameters excluded)."""
  sizes = {}
  for line in hlo_text.splitlines():
    if " parameter(" in line:
      continue
    m = _HLO_VALUE.match(line)
    if not m:
      continue
    kind, dims = m.group(2).split("[")
    dims = [int(d) for d in dims.rstrip("]").split(",") if d]
    nbytes = int(np.prod(dims, dtype=np.int64)) * _ITEMSIZE[kind]
    key = m.group(2)
    if nbytes > sizes.get(key, (0, ""))[0]:
      sizes[key] = (nbytes, m.group(1))
  ranked = sorted(sizes.items(), key=lambda kv: -kv[1][0])[:top]
  return [f"{name} {shape} ({nbytes / GIB:.2f} GiB)" for shape, (nbytes, name) in ranked]


def out_of_memory(error: Exception) -> Optional[dict]:
  """The row of a compile that failed for memory: {"error", "needs_gib", "chip_gib"}; None for
  any other failure."""
  text = str(error)
  if "RESOURCE_EXHAUSTED" not in text:
    return None
  m = _OOM.search(text)
  if not m:
    line = next((l for l in text.splitlines() if "RESOURCE_EXHAUSTED" in l), text)
    return {"error": line.strip()[:300], "needs_gib": float("nan"), "chip_gib": float("nan")}
  needs = float(m.group(1)) * _UNIT[m.group(2)]
  has = float(m.group(3)) * _UNIT[m.group(4)]
  return {"error": f"needs {needs:.2f} GiB of temporaries, the chip has {has:.2f}",
          "needs_gib": needs, "chip_gib": has}


def measure(lower: Callable[[], Any], resident_bytes: int = 0, *,
            chip: Optional[targets.Chip] = None, trips: float = 1.0,
            kv_tokens: Optional[float] = None) -> tuple[dict, Optional[Any]]:
  """(the row of the program `lower()` lowers, the compiled program or None when the compiler
  refused it for memory). Other compile errors propagate."""
  t0 = time.perf_counter()
  try:
    compiled = lower().compile()
  except Exception as e:  # pylint: disable=broad-except
    row = out_of_memory(e)
    if row is None:
      raise
    row.update(peak_gib=row["needs_gib"] + resident_bytes / GIB,
               resident_gib=resident_bytes / GIB, compile_s=time.perf_counter() - t0)
    return row, None
  compile_s = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  argument, output = mem.argument_size_in_bytes, mem.output_size_in_bytes
  alias, temp = mem.alias_size_in_bytes, mem.temp_size_in_bytes
  peak = argument + output - alias + temp + resident_bytes
  text = compiled.as_text()
  cost = roofline.program_cost(text, unknown_trips=trips, kv_tokens=kv_tokens)
  xla = compiled.cost_analysis() or {}
  xla = xla[0] if isinstance(xla, (list, tuple)) else xla
  row = {"argument_gib": argument / GIB, "output_gib": output / GIB, "alias_gib": alias / GIB,
         "temp_gib": temp / GIB, "resident_gib": resident_bytes / GIB, "peak_gib": peak / GIB,
         "compile_s": compile_s, "largest": largest_values(text),
         "flops": cost.flops, "bytes": cost.bytes, "unknown_loops": cost.unknown_loops,
         "trips": trips, "unknown_kernels": cost.unknown_kernels,
         "xla_flops": float(xla.get("flops", 0.0))}
  if chip is not None:
    row["bound_s"] = roofline.bound_s(cost, chip)
  return row, compiled


def checkpoint_bytes(tree: Any) -> tuple[int, int]:
  """(bytes a checkpoint of `tree` holds, the most bytes any one process writes) of a pytree of
  arrays or `jax.ShapeDtypeStruct`s with shardings: each distinct shard of an array is written
  once, by the process of the first device holding it (a replicated array by one process)."""
  total, by_process = 0, {}
  for leaf in jax.tree.leaves(tree):
    itemsize = leaf.dtype.itemsize
    total += int(np.prod(leaf.shape, dtype=np.int64)) * itemsize
    written = set()
    for device, index in leaf.sharding.devices_indices_map(leaf.shape).items():
      bounds = tuple((s.start, s.stop) for s in index)
      if bounds in written:
        continue
      written.add(bounds)
      size = int(np.prod([len(range(*s.indices(n))) for s, n in zip(index, leaf.shape)],
                         dtype=np.int64)) * itemsize
      by_process[device.process_index] = by_process.get(device.process_index, 0) + size
  return total, max(by_process.values(), default=0)
