"""A plan read as a person reads it: the verdict per program, the bounds on a step, the lines a
terminal prints.

  print(report.describe(planner.plan(config, target="v5e-8")))

`roofline(plan)` turns the programs' roofline times (`roofline.bound_s`, TPU targets) into
bounds a run can be held to, each a compiler's count against a chip's published peaks, not a
measured time:
  step_s                         the least time one synchronous step takes (select + the
                                 engine's copy of the weights when it has one + prefill +
                                 decode + learn), every completion at max_new_tokens
  rollout_tokens_per_s_per_chip  at most this many new tokens a second a chip (R x N over
                                 prefill + decode)
  learned_tokens_per_s_per_chip  at most this many completion tokens learned from a second a
                                 chip (P x G x N over the learn step)
Beside each bound, the program's physical limit on the target's chips (`physical`): the least
time the model's own work takes, its FLOPs at the chips' peak or the bytes it must read at their
bandwidth, whichever is longer, every chip taking an equal share:
  prefill   FLOPs 2 N per prompt token (the output head at each prompt's last position only),
            each prompt once, plus causal attention; bytes: the weights (in the compute dtype)
            once
  decode    FLOPs 2 N per new token plus attention over its context; bytes: the weights once per
            decode iteration (the planned trips) and every new token's context from the KV cache
  learn     FLOPs `model_flops`; bytes: the weights read by the forward and the backward pass
  select, reshard: none (choosing prompts and copying weights are not the model's work)
and the step's: their sum; `step_ratio` = step_s over it (1 is the chip's limit).
And two efficiency figures (any target):
  decode_bytes_ratio   a decode iteration's HBM bytes over the bytes it must read at least
                       (the weights it decodes with, in their layout, and the whole KV cache,
                       per device): 1 is the floor; above it, the loop re-reads, gathers,
                       copies or spills
  learn_flops_ratio    the learn step's counted FLOPs over the model's: 6 N per token (N the
                       matmul parameters) for the tokens the step runs forward (each prompt once
                       per group, every completion) plus 12 L d_attn per causal query-key pair
                       (a token at position p attends over p + 1 keys), times the epochs.
                       Around 1 for one pass; the no-gradient passes (old policy,
                       reference), rematerialisation (about +2 N per token) and padding add to
                       it, LoRA's frozen weights (no weight gradient) take about 2 N off.
"""

import math
from typing import Optional

_ROLES = ("select", "prefill", "decode", "learn")
_EVERY_STEP = ("reshard",)   # programs of a step when the plan has them


def fits(row: dict, hbm_gib: float) -> bool:
  """Whether a program compiled and its peak is within the budget."""
  return "error" not in row and row["peak_gib"] <= hbm_gib


def _pairs(prompt_len: int, new_tokens: int, group: int) -> float:
  """Causal query-key pairs of a prompt run once and `group` completions of `new_tokens` after
  it (a token at position p attends over p + 1 keys)."""
  tp, n = prompt_len, new_tokens
  return tp * (tp + 1) / 2 + group * (n * tp + n * (n + 1) / 2)


def model_flops(plan: dict) -> float:
  """The learn step's model FLOPs (module docstring)."""
  m, w = plan["model"], plan["workload"]
  tokens = w["trained_prompts"] * (w["prompt_len"] + w["group"] * w["new_tokens"])
  pairs = w["trained_prompts"] * _pairs(w["prompt_len"], w["new_tokens"], w["group"])
  return (6 * m["matmul_params"] * tokens
          + 12 * m["layers"] * m["attention_width"] * pairs) * w["epochs"]


def physical(plan: dict) -> dict:
  """{program: its physical limit in seconds} on the plan's TPU chips (module docstring); empty
  for CPU devices. The decode's needs the decode program's planned trips."""
  chip = plan.get("chip")
  if not chip:
    return {}
  m, w, chips = plan["model"], plan["workload"], plan["devices"]
  seconds = lambda flops, nbytes: max(flops / chip["bf16_flops"],
                                      nbytes / chip["hbm_bytes_per_s"]) / chips
  weights = m["matmul_params"] * m["itemsize"]
  attention = 4 * m["layers"] * m["attention_width"]        # forward FLOPs per query-key pair
  kv_token = 2 * m["layers"] * m["kv_width"] * m["cache_itemsize"]
  tp, n, prompts, rows = w["prompt_len"], w["new_tokens"], w["prompts"], w["rows"]
  out = {"select": 0.0, "reshard": 0.0, "reshard_base": 0.0,
         "learn": seconds(model_flops(plan), 2 * weights)}
  head = m["vocab"] * m["d_model"]                          # the output head, last position only
  out["prefill"] = seconds(2 * (m["matmul_params"] - head) * prompts * tp + 2 * head * prompts
                           + attention * prompts * _pairs(tp, 0, 0), weights)
  decode = plan["programs"].get("decode", {})
  if "trips" in decode:
    contexts = rows * (n * tp + n * (n + 1) / 2)              # keys read over the new tokens
    out["decode"] = seconds(2 * m["matmul_params"] * rows * n + attention * contexts,
                            decode["trips"] * weights + contexts * kv_token)
  return {name: out[name] for name in plan["programs"] if name in out}


def roofline(plan: dict) -> dict:
  """The bounds and ratios of the module docstring that `plan`'s programs allow (a bound is None
  when a program it needs was not planned, did not compile, or the target is not a TPU)."""
  programs, w = plan["programs"], plan["workload"]
  chips = plan["devices"]
  ok = lambda name: name in programs and "error" not in programs[name]
  time_of = lambda name: programs[name].get("bound_s") if ok(name) else None
  out = {"step_s": None, "rollout_tokens_per_s_per_chip": None,
         "learned_tokens_per_s_per_chip": None, "decode_bytes_ratio": None,
         "learn_flops_ratio": None, "physical_s": physical(plan), "step_limit_s": None,
         "step_ratio": None}
  step = [name for name in _ROLES + _EVERY_STEP if name in _ROLES or name in programs]
  times = [time_of(name) for name in step]
  if all(t is not None for t in times):
    out["step_s"] = sum(times)
  if all(name in out["physical_s"] for name in step):
    out["step_limit_s"] = sum(out["physical_s"][name] for name in step)
    if out["step_s"] is not None and out["step_limit_s"] > 0:
      out["step_ratio"] = out["step_s"] / out["step_limit_s"]
  if time_of("prefill") is not None and time_of("decode") is not None:
    out["rollout_tokens_per_s_per_chip"] = (w["rows"] * w["new_tokens"] / chips
                                            / (time_of("prefill") + time_of("decode")))
  if time_of("learn"):
    learned = w["trained_prompts"] * w["group"] * w["new_tokens"]
    out["learned_tokens_per_s_per_chip"] = learned / chips / time_of("learn")
  if ok("decode") and plan.get("cache_gib"):
    must = (plan.get("engine_policy_gib", plan["policy_gib"]) + plan["cache_gib"]) * 2 ** 30
    d = programs["decode"]
    out["decode_bytes_ratio"] = d["bytes"] / d["trips"] / must
  if ok("learn"):
    out["learn_flops_ratio"] = programs["learn"]["flops"] * chips / model_flops(plan)
  return out


def _num(x: Optional[float], fmt: str) -> str:
  return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _program_line(name: str, p: dict, hbm_gib: float, limit: Optional[float]) -> str:
  if "error" in p:
    return f"{name:8s} {p.get('program', name)}: {p['error']}  DOES NOT FIT"
  verdict = "FITS" if fits(p, hbm_gib) else "DOES NOT FIT"
  bound = (f"  bound {p['bound_s'] * 1e3:,.2f} ms ({p['flops'] / 1e12:,.3f} TFLOP, "
           f"{p['bytes'] / 2 ** 30:,.2f} GiB moved)" if "bound_s" in p else "")
  if bound and limit:
    bound += f", limit {limit * 1e3:,.2f} ms ({p['bound_s'] / limit:.2f}x)"
  if p.get("unknown_kernels"):
    bound += f", {p['unknown_kernels']} kernel(s) not counted"
  return (f"{name:8s} peak {p['peak_gib']:8.2f} GiB  (argument {p['argument_gib']:.2f}, "
          f"output {p['output_gib']:.2f}, alias {p['alias_gib']:.2f}, temp "
          f"{p['temp_gib']:.2f}, resident {p['resident_gib']:.2f})  compile "
          f"{p['compile_s']:.1f} s{bound}  {verdict}")


def describe(plan: dict) -> str:
  """The plan as a few lines for a terminal."""
  m, w = plan["model"], plan["workload"]
  chip = plan.get("chip")
  platform = plan["target"].split(":")[0].replace("cuda", "gpu").upper()
  where = (f"{plan['target']}: {plan['devices']} {chip['name']} chips by XLA:TPU" if chip
           else f"{plan['target']}: {plan['devices']} devices by XLA:{platform}")
  lines = [f"{where}, mesh {plan['mesh']}, budget {plan['hbm_gib']:.2f} GiB per device",
           f"model: {m['layers']} layers, d {m['d_model']}, vocab {m['vocab']}, "
           f"{m['params'] / 1e6:,.1f}M parameters, {m['dtype']} compute on {m['param_dtype']} "
           f"parameters, scan_layers={m['scan_layers']}, remat={m['remat']}, attention "
           f"{m.get('attention', 'reference')} (block {m.get('attention_block', 0)})",
           f"step: {w['prompts']} prompts x {w['group']} = {w['rows']} rows, prompt "
           f"{w['prompt_len']} + {w['new_tokens']} new tokens, {w['minibatches']} minibatches x "
           f"{w['microbatches']} microbatches, logits chunk {w['logits_chunk']}, KV pages of "
           f"{w.get('page_size', 0)} tokens (0: dense)",
           f"train state: {plan['state_gib']:.2f} GiB per device; a checkpoint "
           f"{plan['checkpoint']['gib']:.2f} GiB, at most "
           f"{plan['checkpoint']['gib_per_host']:.2f} GiB written by one host"]
  if plan.get("rollout_mesh"):
    lines.append(f"rollouts: a copy of the weights made once a step on mesh "
                 f"{plan['rollout_mesh']}, {plan['engine_policy_gib']:.2f} GiB per device")
  r = plan.get("roofline", {})
  for name, p in plan["programs"].items():
    lines.append(_program_line(name, p, plan["hbm_gib"], r.get("physical_s", {}).get(name)))
    for value in p.get("largest", [])[:3]:
      lines.append(f"           largest: {value}")
  if chip:
    lines.append(
        f"bounds (compiler counts over {chip['name']} peaks, {chip['bf16_flops'] / 1e12:.0f} "
        f"TFLOP/s, {chip['hbm_bytes_per_s'] / 1e9:.0f} GB/s; not measured times): step >= "
        f"{_num(r.get('step_s'), '.3f')} s, rollout <= "
        f"{_num(r.get('rollout_tokens_per_s_per_chip'), ',.0f')} tokens/s a chip, learning <= "
        f"{_num(r.get('learned_tokens_per_s_per_chip'), ',.0f')} tokens/s a chip")
    lines.append(f"physical limit (the model's own FLOPs and bytes at those peaks): step >= "
                 f"{_num(r.get('step_limit_s'), '.3f')} s; the bound is "
                 f"{_num(r.get('step_ratio'), '.2f')}x it")
  if r.get("decode_bytes_ratio") is not None or r.get("learn_flops_ratio") is not None:
    lines.append(f"efficiency: decode reads {_num(r.get('decode_bytes_ratio'), '.2f')}x the "
                 f"bytes it must (weights + KV cache); learn computes "
                 f"{_num(r.get('learn_flops_ratio'), '.2f')}x the model's FLOPs")
  bad = [name for name, p in plan["programs"].items() if not fits(p, plan["hbm_gib"])]
  lines.append("FITS" if not bad else "DOES NOT FIT: " + ", ".join(bad))
  return "\n".join(lines)
