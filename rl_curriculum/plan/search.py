"""The fastest configuration that fits a target: the planner run over candidate settings.

  result = search.search(config, target="v5e-32")
  print(search.describe(result))      # the fitting candidates, fastest first, and the overrides

A step's programs fall into two families that share none of the settings searched, so each is
searched on its own, compiling only its programs (`planner.plan(programs=...)`):

  learn     model.remat (none, dots, block: least recomputation first) x rl.microbatches (the
            counts that split a minibatch into whole groups or equal parts of every group)
  rollout   parallel.rollout_layout (learner; replicated; tensor over 2, 4, ... devices as far
            as the KV heads divide) x rl.decode_slots (the rows, halved while the batch shards of
            the learner's and the rollout's meshes divide them), rl.kv_pages kept in
            proportion to the slots

Cheapest first, stopping where nothing can improve. Memory falls as microbatches rise and rises
with decode slots; FLOPs rise with recomputation and decode iterations fall with slots. So:
  learn     for each remat policy, the fewest microbatches that fit: the most tried first (when
            it does not fit, no count does), then bisection (a count that does not fit rules out
            every smaller one); a policy that recomputes more is tried only below the fewest
            microbatches found so far, where alone it could run faster
  rollout   for each layout, the most decode slots that fit, the fewest tried first, then
            bisection
Each candidate is one plan (a compiler's out-of-memory is a row, not an error; so is a candidate
the config checks refuse). The best of each family together make the step; its bound is
`report.roofline` of their programs with the config's select. A family with no fitting
candidate is named with the least memory any of its candidates needed. Fewer microbatches run
faster here because each microbatch gathers the FSDP-split weights again (on a v5e-32, the 7B's
learn step: 63 s at 8 microbatches, 882 s at 256).
"""

import math
from typing import Any, Callable, Optional

import ml_collections

from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.parallel import rollout_layout
from rl_curriculum.plan import planner
from rl_curriculum.plan import report as report_lib
from rl_curriculum.plan import targets
from rl_curriculum.sampling import pages
from rl_curriculum.train.rollout import budget
from rl_curriculum.train.setup import builders
from rl_curriculum.train.setup import validation

REMAT_ORDER = ("none", "dots", "block")   # least recomputation first


def with_overrides(config: ml_collections.ConfigDict, overrides: dict
                   ) -> ml_collections.ConfigDict:
  """A copy of `config` with `overrides` ({"rl.microbatches": 4, ...}) set."""
  out = config.copy_and_resolve_references()
  with out.unlocked():
    for path, value in overrides.items():
      section, field = path.rsplit(".", 1)
      parent = out
      for name in section.split("."):
        parent = getattr(parent, name)
      setattr(parent, field, value)
  return out


def microbatch_choices(config: ml_collections.ConfigDict) -> list:
  """The microbatch counts validation accepts, ascending: divisors of a minibatch's prompts,
  then multiples of it that split every group into equal parts."""
  rl = config.rl
  per = rl.prompts_per_step // rl.minibatches
  out = [m for m in range(1, per + 1) if per % m == 0]
  out += [per * k for k in range(2, rl.group_size + 1) if rl.group_size % k == 0]
  return out


def slot_choices(config: ml_collections.ConfigDict, rows: int, shards: int) -> list:
  """Decode slot counts, most first: the rows, halved while `shards` (the batch shards the slots
  split over) divide them. The static engine has none to choose."""
  if config.rl.engine == "static":
    return [config.rl.decode_slots]
  out, slots = [], rows
  while slots >= shards and slots % shards == 0:
    out.append(slots)
    if slots % 2:
      break
    slots //= 2
  return out


def _kv_pages(config: ml_collections.ConfigDict, slots: int, shards: int) -> int:
  """The config's pages per decode slot at `slots` slots, a multiple of the batch shards and at
  least what validation asks (`checks.check_decode_slots`); 0 stays 0."""
  rl = config.rl
  if not (rl.page_size and rl.kv_pages):
    return rl.kv_pages
  pages_now = rl.kv_pages * slots / rl.decode_slots
  least = shards * (pages.row_pages(rl.max_new_tokens, rl.page_size) + slots // shards - 1)
  return max(least, int(math.ceil(pages_now / shards)) * shards)


def layout_choices(config: ml_collections.ConfigDict, devices: int, kv_heads: int) -> list:
  """(layout, tensor) pairs: the learner's, replicated, and tensor over each size of
  `rollout_layout.tensor_sizes` that divides the KV heads."""
  out = [("learner", 1), ("replicated", 1)]
  out += [("tensor", t) for t in rollout_layout.tensor_sizes(devices) if kv_heads % t == 0]
  return out


def _bisect(choices: list, fits: Callable[[Any], bool]) -> Optional[Any]:
  """The first of `choices` that fits, when fitting is monotone (every choice after one that
  fits fits too): the last tried first (when it does not fit, none does), then bisection."""
  if not choices or not fits(choices[-1]):
    return None
  lo, hi, found = 0, len(choices) - 2, choices[-1]
  while lo <= hi:
    mid = (lo + hi) // 2
    if fits(choices[mid]):
      found, hi = choices[mid], mid - 1
    else:
      lo = mid + 1
  return found


class _Runner:
  """Plans candidates and keeps their rows."""

  def __init__(self, config, target, prompt_len: int, log: Callable[[str], None]):
    self.config, self.target, self.prompt_len, self.log = config, target, prompt_len, log
    self.rows = []

  def plan(self, family: str, overrides: dict, programs: tuple) -> dict:
    try:
      plan = planner.plan(with_overrides(self.config, overrides), target=self.target,
                          prompt_len=self.prompt_len, programs=programs)
    except validation.ConfigError as e:   # a candidate the config checks refuse
      row = {"family": family, "overrides": overrides, "fits": False, "bound_s": None,
             "peak_gib": float("nan"), "error": str(e)}
      self.rows.append(row)
      self.log(f"{family} {overrides}: not a valid config ({e})")
      return row
    names = {"learn": ("learn",), "rollout": tuple(n for n in plan["programs"]
                                                   if n != "select")}[family]
    rows = {n: plan["programs"][n] for n in names}
    ok = all(report_lib.fits(r, plan["hbm_gib"]) for r in rows.values())
    bound = (sum(r["bound_s"] for n, r in rows.items() if n != "reshard_base")
             if ok and all("bound_s" in r for r in rows.values()) else None)
    peak = max((r.get("peak_gib", float("nan")) for r in rows.values()), default=float("nan"))
    peak = max((r.get("peak_gib", float("nan")) for r in rows.values()
                if r.get("peak_gib") == r.get("peak_gib")), default=peak)   # NaN-free
    row = {"family": family, "overrides": overrides, "fits": ok, "bound_s": bound,
           "peak_gib": peak, "plan": plan}
    self.rows.append(row)
    self.log(f"{family} {overrides}: {'fits' if ok else 'does not fit'}, peak {peak:.2f} GiB"
             + (f", bound {bound:.2f} s" if bound is not None else ""))
    return row


def _search_learn(run: _Runner) -> Optional[dict]:
  best, limit = None, None
  choices = microbatch_choices(run.config)
  for remat in REMAT_ORDER:
    allowed = [m for m in choices if limit is None or m < limit]
    if not allowed:
      break
    found = {}

    def fits(m, remat=remat, found=found):
      found[m] = run.plan("learn", {"model.remat": remat, "rl.microbatches": m}, ("learn",))
      return found[m]["fits"]

    m = _bisect(allowed, fits)
    if m is None:
      continue
    limit = m
    if best is None or found[m]["bound_s"] < best["bound_s"]:
      best = found[m]
  return best


def _search_rollout(run: _Runner, devices: int, rows: int, kv_heads: int) -> Optional[dict]:
  best = None
  data, fsdp, _ = mesh_lib.resolve_mesh_shape(run.config.parallel.mesh_shape, devices)
  learner = data * fsdp             # the learner mesh's batch shards
  for layout, tensor in layout_choices(run.config, devices, kv_heads):
    # Slots and pages split over the batch shards of both meshes (the config checks ask both).
    shards = math.lcm(learner, devices // tensor if layout == "tensor" else devices)
    found = {}

    def fits(slots, layout=layout, tensor=tensor, shards=shards, found=found):
      overrides = {"parallel.rollout_layout": layout, "parallel.rollout_tensor": tensor,
                   "rl.decode_slots": slots, "rl.kv_pages": _kv_pages(run.config, slots, shards)}
      found[slots] = run.plan("rollout", overrides, ("sampler",))
      return found[slots]["fits"]

    slots = _bisect(slot_choices(run.config, rows, shards), fits)
    if slots is not None and (best is None or found[slots]["bound_s"] < best["bound_s"]):
      best = found[slots]
  return best


def search(config: ml_collections.ConfigDict, *, target: Any, prompt_len: int = 256,
           log: Callable[[str], None] = lambda line: None,
           families: tuple = ("learn", "rollout")) -> dict:
  """Searches the candidates of the module docstring for `target` (a TPU slice's name or
  `targets.Target`); `families` the ones to search (both to bound a step; one alone, e.g. each
  in a process of its own, gives that family's best).

  Returns:
    {"target", "candidates": every candidate planned (family, overrides, fits, bound_s,
     peak_gib), "learn" and "rollout": the best of each (None: nothing fits), "step": the
     best step's roofline (`report.roofline`) or None, "overrides": the best's settings as
     command-line flags, "unfit": families with no fitting candidate and the least peak any
     needed}.
  """
  target = targets.parse(target) if isinstance(target, str) else target
  if not target.is_tpu:
    raise ValueError(f"--search compares roofline bounds: it needs a TPU target, got "
                     f"{target.name}")
  run = _Runner(config, target, prompt_len, log)
  shape = planner.model_shape(config)
  rows = builders.sampled_prompts(config) * budget.group_slots(config)
  learn = _search_learn(run) if "learn" in families else None
  rollout = (_search_rollout(run, target.chips, rows, shape.num_kv_heads)
             if "rollout" in families else None)
  out = {"target": target.name, "learn": learn and _public(learn),
         "rollout": rollout and _public(rollout),
         "candidates": [_public(r) for r in run.rows], "step": None, "overrides": [],
         "unfit": {}}
  for family, best in (("learn", learn), ("rollout", rollout)):
    if best is None and family in families:
      tried = [r for r in run.rows if r["family"] == family]
      out["unfit"][family] = min((r["peak_gib"] for r in tried
                                  if r["peak_gib"] == r["peak_gib"]), default=float("nan"))
  if learn and rollout:
    chosen = {**rollout["overrides"], **learn["overrides"]}
    select = planner.plan(with_overrides(config, chosen), target=target, prompt_len=prompt_len,
                          programs=("select",))["programs"]["select"]
    combined = dict(rollout["plan"])
    combined["programs"] = {"select": select, **rollout["plan"]["programs"],
                            "learn": learn["plan"]["programs"]["learn"]}
    out["step"] = report_lib.roofline(combined)
    out["overrides"] = [f"--config.{k}={v}" for k, v in chosen.items()]
  return out


def _public(row: dict) -> dict:
  return {k: v for k, v in row.items() if k != "plan"}


def describe(result: dict) -> str:
  """The search as lines for a terminal: the fitting candidates of each family, fastest first,
  then the best step and its overrides, or what cannot fit."""
  lines = [f"search on {result['target']}:"]
  for family in ("learn", "rollout"):
    if not any(r["family"] == family for r in result["candidates"]):
      continue
    fitting = sorted((r for r in result["candidates"] if r["family"] == family and r["fits"]),
                     key=lambda r: r["bound_s"])
    tried = sum(r["family"] == family for r in result["candidates"])
    lines.append(f"{family}: {len(fitting)} of {tried} candidates fit")
    for r in fitting:
      settings = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in r["overrides"].items())
      lines.append(f"  bound {r['bound_s']:9.3f} s  peak {r['peak_gib']:6.2f} GiB  {settings}")
  for family, peak in result["unfit"].items():
    lines.append(f"DOES NOT FIT: no {family} candidate fits (the least memory any needed: "
                 f"{peak:.2f} GiB a device)")
  step = result["step"]
  if step:
    limit = ("" if step["step_limit_s"] is None else
             f", physical limit {step['step_limit_s']:.2f} s ({step['step_ratio']:.2f}x)")
    lines.append(f"best step: bound {step['step_s']:.2f} s{limit}")
    lines.append("run it with: " + " ".join(result["overrides"]))
  return "\n".join(lines)
