"""What a compiled program costs, loops counted, and the least time a chip could run it in.

  cost = roofline.program_cost(compiled.as_text(), unknown_trips=n_new)
  seconds = roofline.bound_s(cost, targets.CHIPS["v5e"])    # max(FLOPs / peak, bytes / bandwidth)

XLA's own cost analysis (`compiled.cost_analysis()`) counts a while loop's body once, so for a
program made of loops (layers under `lax.scan`, microbatches, the decode loop) its FLOPs and bytes
are a fraction of what runs. `program_cost` reads the optimised per-device HLO instead and counts
every computation as often as it executes:
  FLOPs  of `dot` and `convolution` instructions, wherever they are (inside fusions too):
         2 x output elements x contracted elements, a convolution's window counted by the taps
         that land on input elements (other instructions' FLOPs, elementwise and reductions,
         are left out: they are memory-bound and counted by their bytes);
  bytes  operands read and results written by each instruction of a computation that runs on its
         own (the entry, loop bodies, branches; a fusion is one instruction), as XLA's cost
         analysis counts them, with the refinements it also makes: a fusion operand that the
         fused code only slices (a scanned layer's weights, one step of a stacked array) counts
         the slices it reads, an operand a fusion updates in place counts the update, and an
         operand a fusion passes through to its output (the buffers of a collective fused into
         it) counts neither as read nor as written;
  loops  a `while` whose condition is `counter < C` runs its body ceil((C - start) / step)
         times, start and step read off the loop (0 and 1 for `lax.scan` and `fori_loop`; XLA's
         windowed matmuls under FSDP step by 2). Any other loop (a decode loop that stops when
         its rows are done) is counted in `unknown_loops`: the first such loop of a computation
         runs `unknown_trips` times, later ones beside it none (the continuous engine's stages
         at halved slots only decode what the full-width stage left: for a lower bound, every
         token is decoded at full width), one nested in such a loop once.
  kernels  a TPU kernel (a Pallas custom call: ragged paged attention, splash attention's
         forward and backward) is counted by its shapes (`kernels`), as XLA reads no cost from
         it; one that module does not know counts nothing and is counted in `unknown_kernels`.
Bookkeeping instructions (parameters, constants, tuples, bitcasts) move no bytes; any other
custom call (a buffer allocation) counts nothing. A dynamic-update-slice
or a scatter (alone, or at the root of a fusion whose operand it updates) works in place: it
moves its update's bytes, not the buffer's.

The bound is a roofline (Williams, Waterman and Patterson 2009, "Roofline: an insightful visual
performance model for multicore architectures", CACM 52(4)): a program takes at least its FLOPs
over the chip's peak and at least its bytes over the chip's HBM bandwidth. It is a compiler's
count against published peaks, not a measured time: real programs run slower (collectives,
latency, imperfect overlap).
"""

import dataclasses
import re
from typing import Optional

from rl_curriculum.plan import convolution
from rl_curriculum.plan import kernels
from rl_curriculum.plan import targets

_ITEMSIZE = {"f64": 8, "s64": 8, "u64": 8, "c64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2,
             "f16": 2, "s16": 2, "u16": 2, "s8": 1, "u8": 1, "pred": 1, "f8e4m3fn": 1,
             "f8e5m2": 1, "s4": 1, "u4": 1}
_ARRAY = re.compile(r"\b(" + "|".join(_ITEMSIZE) + r")\[([\d,]*)\]")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\((.*)\)\s*->\s*(.*)\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\((.*)$")
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
         "partition-id", "replica-id", "iota", "opt-barrier", "while", "call", "conditional",
         "custom-call"}
_SLICING = {"dynamic-slice", "slice", "gather"}


@dataclasses.dataclass
class Cost:
  """A program's FLOPs and HBM bytes per device, loops counted."""
  flops: float = 0.0
  bytes: float = 0.0
  unknown_loops: int = 0   # loops of unknown trip count (each counted `unknown_trips` times)
  unknown_kernels: int = 0  # TPU kernels (custom calls) `kernels` does not know: counted as 0

  def scaled(self, n: float) -> "Cost":
    return Cost(self.flops * n, self.bytes * n, self.unknown_loops, self.unknown_kernels)

  def __add__(self, other: "Cost") -> "Cost":
    return Cost(self.flops + other.flops, self.bytes + other.bytes,
                self.unknown_loops + other.unknown_loops,
                self.unknown_kernels + other.unknown_kernels)


def _nbytes(shape_text: str) -> int:
  """Bytes of every array in a (possibly tuple) HLO shape."""
  total = 0
  for kind, dims in _ARRAY.findall(shape_text):
    n = 1
    for d in dims.split(","):
      if d:
        n *= int(d)
    total += n * _ITEMSIZE[kind]
  return total


def _dims(shape_text: str) -> list:
  m = _ARRAY.search(shape_text)
  return [int(d) for d in m.group(2).split(",") if d] if m else []


def _split_top(text: str) -> list:
  """Comma-separated items of `text` at bracket depth 0."""
  items, depth, start = [], 0, 0
  for i, ch in enumerate(text):
    if ch in "([{":
      depth += 1
    elif ch in ")]}":
      depth -= 1
    elif ch == "," and depth == 0:
      items.append(text[start:i].strip())
      start = i + 1
  items.append(text[start:].strip())
  return [x for x in items if x]


@dataclasses.dataclass
class _Instruction:
  name: str
  shape: str
  opcode: str
  operands: list
  attrs: str


def _parse_instruction(line: str) -> Optional[_Instruction]:
  m = _INSTRUCTION.match(line)
  if not m:
    return None
  name, shape, opcode, rest = m.groups()
  depth = 1
  for i, ch in enumerate(rest):
    depth += ch == "("
    depth -= ch == ")"
    if depth == 0:
      break
  operands = [o.split()[-1].lstrip("%") for o in _split_top(rest[:i])]
  return _Instruction(name, shape, opcode, operands, rest[i + 1:])


def parse_module(hlo_text: str) -> dict:
  """{computation name: (parameter shapes {name: shape text}, [instructions])}."""
  computations, current = {}, None
  for line in hlo_text.splitlines():
    header = _HEADER.match(line)
    if header and not line.startswith(" "):
      current = header.group(1)
      params = {}
      for item in _split_top(header.group(2)):
        if ":" in item:
          pname, pshape = item.split(":", 1)
          params[pname.strip().lstrip("%")] = pshape.strip()
      computations[current] = (params, [])
      if line.startswith("ENTRY"):
        computations["__entry__"] = computations[current]
      continue
    # A computation ends at a line "}"; a kernel's metadata may span lines of its own, one of
    # which may start with "}" too (a JSON string's end): those are not instructions.
    if current is None or not line.startswith(" "):
      if line.rstrip() == "}":
        current = None
      continue
    inst = _parse_instruction(line)
    if inst:
      computations[current][1].append(inst)
  return computations


def _attr(attrs: str, key: str) -> Optional[str]:
  m = re.search(key + r"=%?([\w.\-]+)", attrs)
  return m.group(1) if m else None


def _dot_flops(inst: _Instruction, shapes: dict) -> float:
  out = 1
  for d in _dims(inst.shape):
    out *= d
  if inst.opcode == "dot":
    lhs = _dims(shapes.get(inst.operands[0], ""))
    m = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", inst.attrs)
    contracted = 1
    for d in (m.group(1).split(",") if m else []):
      if d:
        contracted *= lhs[int(d)]
    return 2.0 * out * contracted
  # convolution: 2 x output elements x input features x the taps of the window that land on
  # input elements, on average over the output positions (XLA:TPU writes batched matmuls as
  # convolutions whose batch dimensions are spatial, dilated or padded so that each output
  # sees one input element: one tap, however wide the window).
  rhs = _dims(shapes.get(inst.operands[1], ""))
  labels = re.search(r"dim_labels=(\w*)_(\w+)->(\w+)", inst.attrs)
  if not rhs or not labels or "i" not in labels.group(2):
    return 0.0
  lhs = _dims(shapes.get(inst.operands[0], ""))
  return 2.0 * out * rhs[labels.group(2).index("i")] * convolution.taps(
      inst.attrs, labels.group(1), labels.group(3), lhs, _dims(inst.shape))


class _Counter:
  """Costs of a parsed module's computations, memoised."""

  def __init__(self, computations: dict, unknown_trips: float, kv_tokens: Optional[float]):
    self.computations = computations
    self.unknown_trips = unknown_trips
    self.kv_tokens = kv_tokens
    self.memo = {}
    self.shape_tables = {}
    self.fused_flops = {}

  def shapes(self, name: str) -> dict:
    """{value name: shape text} of computation `name` (its parameters and instructions)."""
    if name not in self.shape_tables:
      params, instructions = self.computations[name]
      table = dict(params)
      table.update({inst.name: inst.shape for inst in instructions})
      self.shape_tables[name] = table
    return self.shape_tables[name]

  def flops(self, name: str) -> float:
    """FLOPs of a fused computation (and what it calls)."""
    if name not in self.fused_flops:
      shapes = self.shapes(name)
      total = 0.0
      for inst in self.computations[name][1]:
        if inst.opcode in ("dot", "convolution"):
          total += _dot_flops(inst, shapes)
        called = _attr(inst.attrs, "calls")
        if called in self.computations:
          total += self.flops(called)
      self.fused_flops[name] = total
    return self.fused_flops[name]

  def read_bytes(self, computation: str, value: str, full: float) -> float:
    """Bytes that `computation` reads of its value `value` (at most `full`): the slices it
    takes when every use slices it (through bitcasts and nested fusions), the update when it
    only updates it in place, else all of it."""
    body = self.computations[computation][1]
    inner = self.shapes(computation)
    total = 0.0
    for user in body:
      for i, operand in enumerate(user.operands):
        if operand != value:
          continue
        if user.opcode in _SLICING and i == 0:
          total += _nbytes(user.shape)
        elif user.opcode == "dynamic-update-slice" and i == 0:
          total += _nbytes(inner.get(user.operands[1], ""))
        elif user.opcode == "scatter" and i == 0 and len(user.operands) == 3:
          total += _nbytes(inner.get(user.operands[2], ""))
        elif user.opcode == "tuple":   # passed through to the fusion's output unread
          continue
        elif user.opcode == "bitcast":
          total += self.read_bytes(computation, user.name, full)
        elif user.opcode == "fusion" and _attr(user.attrs, "calls") in self.computations:
          called = _attr(user.attrs, "calls")
          names = list(self.computations[called][0])
          total += self.read_bytes(called, names[i], full) if i < len(names) else full
        else:
          return full
        if total >= full:
          return full
    return total

  def written_bytes(self, inst: _Instruction) -> float:
    """Bytes a fusion writes: its outputs, but for the elements of an output tuple that pass one
    of its parameters through unchanged (buffers a fused collective carries along), and for an
    output that updates one of its parameters in place (a dynamic-update-slice or a scatter at
    its root: the update's bytes)."""
    called = _attr(inst.attrs, "calls")
    if called not in self.computations:
      return _nbytes(inst.shape)
    if not inst.shape.startswith("("):
      params, body = self.computations[called]
      root = body[-1] if body else None
      update = {"dynamic-update-slice": 1, "scatter": 2}.get(root.opcode if root else "")
      shaped = update == 1 or len(root.operands) == 3  # one operand scattered into
      if update and shaped and root.operands[0] in params:
        return _nbytes(self.shapes(called).get(root.operands[update], ""))
      return _nbytes(inst.shape)
    params, body = self.computations[called]
    root = body[-1] if body else None
    if root is None or root.opcode != "tuple":
      return _nbytes(inst.shape)
    through = {b.name for b in body if b.opcode == "parameter"} | set(params)
    through |= {b.name for b in body if b.opcode == "bitcast" and b.operands[0] in through}
    elements = _split_top(inst.shape.strip()[1:-1])
    return sum(_nbytes(shape) for shape, name in zip(elements, root.operands)
               if name not in through)

  def fusion_operand_bytes(self, inst: _Instruction, shapes: dict) -> float:
    """Bytes a fusion reads of its operands (`read_bytes` of each)."""
    called = _attr(inst.attrs, "calls")
    names = list(self.computations[called][0]) if called in self.computations else []
    total = 0.0
    for i, operand in enumerate(inst.operands):
      size = _nbytes(shapes.get(operand, ""))
      total += self.read_bytes(called, names[i], size) if i < len(names) else size
    return total

  def cost(self, name: str, in_unknown: bool = False) -> Cost:
    """The cost of running computation `name` once (loops inside it counted; inside a loop of
    unknown trip count, a nested loop of unknown trip count counts once)."""
    if (name, in_unknown) in self.memo:
      return self.memo[(name, in_unknown)]
    _, instructions = self.computations[name]
    shapes = self.shapes(name)
    total = Cost()
    unknown_seen = False
    for inst in instructions:
      op = inst.opcode
      if op == "while":
        body, cond = _attr(inst.attrs, "body"), _attr(inst.attrs, "condition")
        trips = self.trips(inst, name)
        inner = in_unknown or trips is None
        once = self.cost(body, inner) + self.cost(cond, inner)
        if trips is None:
          once.unknown_loops += 1
          trips = 1 if in_unknown else 0 if unknown_seen else self.unknown_trips
          unknown_seen = True
        total = total + once.scaled(trips)
        continue
      if op == "conditional":
        branches = re.search(r"branch_computations=\{([^}]*)\}", inst.attrs)
        names = ([b.strip().lstrip("%") for b in branches.group(1).split(",")] if branches
                 else [_attr(inst.attrs, "true_computation"),
                       _attr(inst.attrs, "false_computation")])
        costs = [self.cost(b, in_unknown) for b in names if b in self.computations]
        if costs:   # one branch runs: the cheapest keeps the bound a bound
          total = total + min(costs, key=lambda c: (c.flops, c.bytes))
        continue
      if op == "call":
        called = _attr(inst.attrs, "to_apply")
        if called in self.computations:
          total = total + self.cost(called, in_unknown)
        continue
      if op == "custom-call" and 'custom_call_target="tpu_custom_call"' in inst.attrs:
        total = total + self.kernel(inst, shapes)
        continue
      if op in _FREE or op.endswith("-done"):
        continue
      if op == "fusion":
        total.flops += self.flops(_attr(inst.attrs, "calls"))
        total.bytes += self.fusion_operand_bytes(inst, shapes) + self.written_bytes(inst)
        continue
      if op in ("dot", "convolution"):
        total.flops += _dot_flops(inst, shapes)
      if op in ("dynamic-update-slice", "scatter"):  # in place: the update, read and written
        update = inst.operands[1 if op == "dynamic-update-slice" else -1]
        total.bytes += 2 * _nbytes(shapes.get(update, "")) + sum(
            _nbytes(shapes.get(o, "")) for o in inst.operands[1:-1])
        continue
      total.bytes += sum(_nbytes(shapes.get(o, "")) for o in inst.operands) + _nbytes(inst.shape)
    self.memo[(name, in_unknown)] = total
    return total

  def kernel(self, inst: _Instruction, shapes: dict) -> Cost:
    """A TPU kernel's cost from its shapes (`kernels.cost`); an unknown one counts nothing and
    is counted in `unknown_kernels`."""
    arrays = lambda text: [([int(d) for d in dims.split(",") if d], _ITEMSIZE[kind])
                           for kind, dims in _ARRAY.findall(text)]
    # The operands' shapes as the kernel takes them (the values passed may be async copies'
    # tuples); from the values themselves when the call does not list them.
    listed = re.search(r"operand_layout_constraints=\{(.*?)\}, \w+=", inst.attrs)
    operands = (arrays(listed.group(1)) if listed else
                [next(iter(arrays(shapes.get(o, ""))), ([], 0)) for o in inst.operands])
    counted = kernels.cost(inst.name, operands, arrays(inst.shape), self.kv_tokens)
    return Cost(unknown_kernels=1) if counted is None else Cost(*counted)

  def _constant(self, computation: str, name: str) -> Optional[int]:
    """The integer value of `name` in `computation` when it is a constant (through copies)."""
    by_name = {inst.name: inst for inst in self.computations[computation][1]}
    inst = by_name.get(name)
    while inst is not None and inst.opcode in ("copy", "bitcast", "convert"):
      inst = by_name.get(inst.operands[0])
    if inst is None or inst.opcode != "constant" or not inst.operands:
      return None
    return int(inst.operands[0]) if re.fullmatch(r"-?\d+", inst.operands[0]) else None

  def trips(self, loop: _Instruction, parent: str) -> Optional[int]:
    """The trips of a `while` whose condition is `counter < C` with a constant C and whose body
    adds a constant step to the counter, from a constant start (how scans, fori_loops and
    XLA's windowed matmuls lower): ceil((C - start) / step). A counter whose start or step is
    not a constant is taken to start at 0 and step by 1; any other condition: None."""
    cond, body = _attr(loop.attrs, "condition"), _attr(loop.attrs, "body")
    if cond not in self.computations:
      return None
    _, instructions = self.computations[cond]
    by_name = {inst.name: inst for inst in instructions}
    root = instructions[-1] if instructions else None
    if root is None or root.opcode != "compare" or "direction=LT" not in root.attrs:
      return None
    bound = self._constant(cond, root.operands[1])
    counter = by_name.get(root.operands[0])
    if bound is None:
      return None
    index = (re.search(r"index=(\d+)", counter.attrs) if counter is not None
             and counter.opcode == "get-tuple-element" else None)
    start, step = 0, 1
    if index is not None and body in self.computations:
      i = int(index.group(1))
      body_insts = self.computations[body][1]
      body_by_name = {inst.name: inst for inst in body_insts}
      out = body_insts[-1] if body_insts else None
      update = (body_by_name.get(out.operands[i]) if out is not None and out.opcode == "tuple"
                and i < len(out.operands) else None)
      if update is not None and update.opcode == "add":
        steps = [self._constant(body, o) for o in update.operands]
        step = next((k for k in steps if k), 1)
      parent_by_name = {inst.name: inst for inst in self.computations[parent][1]}
      init = parent_by_name.get(loop.operands[0]) if loop.operands else None
      if init is not None and init.opcode == "tuple" and i < len(init.operands):
        first = self._constant(parent, init.operands[i])
        start = first if first is not None else 0
    return max(0, -(-(bound - start) // step)) if step > 0 else None


def program_cost(hlo_text: str, unknown_trips: float = 1.0,
                 kv_tokens: Optional[float] = None) -> Cost:
  """FLOPs and bytes per device of a compiled program's optimised HLO (`compiled.as_text()`),
  every loop counted as often as it runs and every TPU attention kernel by its shapes
  (`kernels.cost`; `kv_tokens`: the keys a paged-attention sequence attends over on average,
  None for its page table's whole width) (module docstring)."""
  computations = parse_module(hlo_text)
  if "__entry__" not in computations:
    raise ValueError("no ENTRY computation in the HLO text")
  entry_name = next(name for name, value in computations.items()
                    if value is computations["__entry__"] and name != "__entry__")
  return _Counter(computations, unknown_trips, kv_tokens).cost(entry_name)


def bound_s(cost: Cost, chip: targets.Chip) -> float:
  """The roofline: the least seconds `chip` could run `cost` in."""
  return max(cost.flops / chip.bf16_flops, cost.bytes / chip.hbm_bytes_per_s)
