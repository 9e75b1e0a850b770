"""Ratios to the peers, the targets, the markdown summary and the result files."""

import json
import os

TARGETS = [
    ("sampler_b32_new_tok_s_vs_transformers", 2.0, "sampler >= 2x transformers generate at B=32"),
    ("learn_step_vs_trl", 1.5, "learn step >= 1.5x TRL's"),
    ("sampler_b32_new_tok_s_vs_tunix", 1.0, "sampler >= Tunix"),
    ("learn_step_vs_tunix", 1.0, "learn step >= Tunix"),
    ("learn_full_mfu", 0.5, "learn-step utilisation >= 50% of the matmul peak (full FT)"),
    ("learn_lora_mfu", 0.5, "learn-step utilisation >= 50% of the matmul peak (LoRA)"),
]


def ratios(model: dict) -> dict:
  """ours / theirs (higher is better) for every peer present, and the learn steps' MFU."""
  out = {}
  ours = model["sampler"]["ours"]
  for peer in ("transformers", "tunix"):
    theirs = model["sampler"].get(peer) if peer == "transformers" else (
        model.get("tunix", {}).get("sampler"))
    if not theirs:
      continue
    for b, row in ours.items():
      if b in theirs:
        for k in ("new_tok_s", "prefill_tok_s", "decode_tok_s"):
          if theirs[b].get(k):
            out[f"sampler_b{b}_{k}_vs_{peer}"] = row[k] / theirs[b][k]
  trl = model.get("trl", {})
  if "learn_tok_s" in trl:
    out["learn_step_vs_trl"] = model["learn"]["full"]["tok_s"] / trl["learn_tok_s"]
    if "rl_step" in model:
      out["rl_step_vs_trl"] = trl["step_s"] / model["rl_step"]["seconds"]
  learn_tunix = model.get("tunix", {}).get("learn", {})
  if learn_tunix.get("tok_s"):
    mode = learn_tunix.get("mode", "full")
    out["learn_step_vs_tunix"] = model["learn"][mode]["tok_s"] / learn_tunix["tok_s"]
  for mode, row in model["learn"].items():
    out[f"learn_{mode}_mfu"] = row["mfu"]
  return out


def targets(results: dict) -> list:
  """One row per (model, target): the value (None when not measured) and whether it is met."""
  rows = []
  for name, model in results["models"].items():
    for key, bar, what in TARGETS:
      value = model["ratios"].get(key)
      rows.append({"model": name, "key": key, "target": bar, "value": value, "what": what,
                   "met": None if value is None else bool(value >= bar)})
  return rows


def finalize(results: dict) -> None:
  """Adds MFU, ratios and targets to `results` in place.

  MFU is taken against the best matmul rate seen anywhere in the run (the start-of-run peak and
  the checks around every learn measurement: on a shared machine the first one can be low).
  """
  peak = results["matmul_peak_gflops"]
  around = [x for m in results["models"].values() for row in m["learn"].values()
            for x in row["peak_gflops_around"]]
  peak["jax_run_best"] = max([peak["jax_best"]] + around)
  for model in results["models"].values():
    for row in model["learn"].values():
      row["mfu"] = row["gflop_s"] / peak["jax_run_best"]
    model["ratios"] = ratios(model)
  results["targets"] = targets(results)


def _num(x) -> str:
  return "-" if x is None else f"{x:.0f}"


def _model_lines(name: str, model: dict) -> list:
  """The sampler and learn-step tables of one model, and what was skipped."""
  lines = [f"## {name}", "", "| batch | ours new tok/s | ours prefill tok/s | ours decode tok/s "
           "| transformers new tok/s | ratio |", "|---|---|---|---|---|---|"]
  theirs = model["sampler"].get("transformers", {})
  for b, row in model["sampler"]["ours"].items():
    t = theirs.get(b, {})
    ratio = row["new_tok_s"] / t["new_tok_s"] if t else None
    lines.append(f"| {b} | {_num(row['new_tok_s'])} | {_num(row.get('prefill_tok_s'))} | "
                 f"{_num(row.get('decode_tok_s'))} | {_num(t.get('new_tok_s'))} | "
                 f"{'-' if ratio is None else f'{ratio:.2f}x'} |")
  lines += ["", "| learn step | seconds | tok/s | mfu |", "|---|---|---|---|"]
  for mode, row in model["learn"].items():
    lines.append(f"| ours {mode} | {row['seconds']:.3f} | {row['tok_s']:.0f} | "
                 f"{row['mfu']:.3f} |")
  if "learn_tok_s" in model.get("trl", {}):
    trl = model["trl"]
    lines.append(f"| TRL full (learn part) | {trl['learn_s']:.3f} | {trl['learn_tok_s']:.0f} "
                 f"| - |")
    lines.append(f"| TRL whole step | {trl['step_s']:.3f} | - | - |")
  if "rl_step" in model:
    r = model["rl_step"]
    lines.append(f"| ours whole RL step (sample {r['sample_s']:.2f} + score {r['score_s']:.3f}"
                 f" + learn {r['learn_s']:.2f}) | {r['seconds']:.3f} | - | - |")
  skipped = {k: v["skipped"] for k, v in model.items()
             if isinstance(v, dict) and "skipped" in v}
  if skipped:
    lines += ["", "Skipped: " + "; ".join(f"{k}: {v}" for k, v in skipped.items())]
  lines.append("")
  return lines


def markdown(results: dict) -> str:
  """The summary: environment, per-model tables, curriculum overhead, end to end, targets."""
  env = results["environment"]
  lines = [f"# Speed on CPU ({env['date']})", "",
           f"CPU {env['cpu_model']}, affinity {env['affinity']} "
           f"({len(env['affinity'])} core(s) of {env['cpu_count']}), jax {env['jax']}, torch "
           f"{env.get('torch')} ({results.get('torch_threads')} threads), transformers "
           f"{env.get('transformers')}, trl {env.get('trl')}. Matmul peak (float32): jax "
           f"{results['matmul_peak_gflops']['jax_run_best']:.1f} GFLOP/s (best in the run; "
           f"{results['matmul_peak_gflops']['jax_best']:.1f} at the start), torch "
           f"{results['matmul_peak_gflops']['torch_best'] or 0:.1f} GFLOP/s.", "",
           f"Command: `{results['command']}`", ""]
  for name, model in results["models"].items():
    lines += _model_lines(name, model)
  if "curriculum" in results:
    lines += ["## Curriculum overhead (SEC select + update)", ""]
    for row in results["curriculum"]:
      lines.append(f"- K={row['arms']}, P={row['prompts']}, G={row['group']}: "
                   f"{1e3 * row['total_s']:.2f} ms"
                   + (f" = {100 * row['fraction_of_step']:.2f}% of a {row['step_ref']} step"
                      if row.get("fraction_of_step") is not None else ""))
    lines.append("")
  if "end_to_end" in results:
    e = results["end_to_end"]
    lines += ["## End-to-end RL step", "",
              f"{e['config']} (P={e['prompts']}, G={e['group']}, {e['max_new_tokens']} new "
              f"tokens), median of {e['steps_timed']} steps: sample {e['sample_s']:.3f} s, score "
              f"{e['score_s']:.3f} s, learn {e['learn_s']:.3f} s "
              f"({100 * e['sample_frac']:.0f} / {100 * e['score_frac']:.0f} / "
              f"{100 * e['learn_frac']:.0f} %).", ""]
  lines += ["## Targets", "", "| model | target | value | met |", "|---|---|---|---|"]
  for t in results["targets"]:
    value = "-" if t["value"] is None else f"{t['value']:.3f}"
    met = "not measured" if t["met"] is None else ("yes" if t["met"] else "no")
    lines.append(f"| {t['model']} | {t['what']} | {value} | {met} |")
  return "\n".join(lines) + "\n"


def write(results: dict, out_dir: str, name: str) -> None:
  """Writes `out_dir/name.json` (every number) and, once targets exist, `out_dir/name.md`."""
  os.makedirs(out_dir, exist_ok=True)
  base = os.path.join(out_dir, name)
  with open(base + ".json", "w") as f:
    json.dump(results, f, indent=1)
  if "targets" in results:
    with open(base + ".md", "w") as f:
      f.write(markdown(results))
