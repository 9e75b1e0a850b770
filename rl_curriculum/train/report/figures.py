"""End-of-run report: a PNG of the run's curves, an HTML page around it, a before/after table.

Reads the rows of metrics.jsonl. Expected names: `reward_mean`, `correct_mean`,
`nonzero_adv_frac` per step; `eval/acc/<bin>` on evaluation steps; `curriculum/probs/<k>` (arm
sampling probabilities) or `curriculum/arm_frac/<k>` (fraction of the batch drawn from arm k).
A run on several tasks (arms and bins named "task/bin") is drawn per task:
`eval/<task>/accuracy`, and the curriculum's mass per task (the sum over the task's arms).
"""

import html
import os
from typing import Any, Mapping, Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position


def _series(rows, name):
  steps = [r["step"] for r in rows if isinstance(r.get(name), (int, float))]
  values = [r[name] for r in rows if isinstance(r.get(name), (int, float))]
  return np.asarray(steps), np.asarray(values, dtype=float)


def _smooth(values, width):
  if values.size < width or width <= 1:
    return values
  kernel = np.ones(width) / width
  padded = np.concatenate([np.full(width - 1, values[0]), values])
  return np.convolve(padded, kernel, mode="valid")


def task_mass(series: Sequence[np.ndarray], arm_names: Sequence[str],
              tasks: Sequence[str]) -> list[np.ndarray]:
  """Per task, the sum of the per-arm `series` (equal lengths) of its arms, named "task/bin";
  zeros for a task without arms."""
  zero = np.zeros_like(np.asarray(series[0], float))
  return [sum((np.asarray(v, float) for v, arm in zip(series, arm_names)
               if arm.split("/", 1)[0] == task), zero) for task in tasks]


def accuracy_table(before: Mapping[str, float], after: Mapping[str, float],
                   ood: Sequence[str] = (), sizes: Optional[Mapping[str, int]] = None,
                   small: Sequence[str] = (), changes: Optional[Mapping[str, dict]] = None) -> str:
  """A plain-text table of held-out accuracy per bin, before and after training.

  Args:
    before, after: {bin name: accuracy in [0, 1]}.
    ood: names of out-of-distribution bins (tagged).
    sizes: optional {bin name: held-out problems}, shown as a column.
    small: names of bins whose held-out set is too small to compare (tagged; a gain there is
      within noise).
    changes: optional {bin name: `paired.paired_difference` of after against before}: the
      change's 95% interval, paired per problem, as a column.
  """
  names = list(before)
  width = max([len(n) for n in names] + [8])
  ci_col = "     95% interval" if changes else ""
  n_col = "      n" if sizes else ""
  lines = [f"{'bin':<{width}}  before   after   change{ci_col}{n_col}",
           "-" * (width + 27 + len(ci_col) + len(n_col))]
  for name in names:
    b, a = before[name], after.get(name, float("nan"))
    tags = (["ood"] if name in ood else []) + (["too few to compare"] if name in small else [])
    tag = f"  ({', '.join(tags)})" if tags else ""
    ci = ""
    if changes:
      c = changes.get(name)
      ci = (f"  [{100 * c['lo']:+6.1f}, {100 * c['hi']:+6.1f}]" if c else " " * 17)
    n = f"  {sizes[name]:5d}" if sizes else ""
    lines.append(f"{name:<{width}}  {100 * b:6.1f}  {100 * a:6.1f}  {100 * (a - b):+7.1f}{ci}{n}"
                 f"{tag}")
  return "\n".join(lines)


def gain_sources_line(sources: Mapping[str, Any]) -> str:
  """One line on where the trained bins' held-out gain came from (`paired.gain_sources`)."""
  gained, fmt, skill, lost = (sources[k] for k in ("gained", "format", "skill", "lost"))
  if not gained:
    return f"Trained bins: no held-out problem went from wrong to right; {lost} went the other way."
  return (f"Trained bins: {gained} held-out problems went from wrong to right, "
          f"{100 * fmt / gained:.0f}% format ({fmt} whose answer did not parse before) and "
          f"{100 * skill / gained:.0f}% skill ({skill} answered wrongly before); {lost} went from "
          f"right to wrong.")


def _accuracy_panel(ax, rows, bin_names, tasks, cmap) -> None:
  """Held-out accuracy per bin (or per task of a mixture) over the run."""
  curves = ([(f"eval/{t}/accuracy", t) for t in tasks] if tasks else
            [(f"eval/acc/{name}", name) for name in bin_names])
  for i, (key, label) in enumerate(curves):
    steps, values = _series(rows, key)
    if steps.size:
      ax.plot(steps, 100 * values, marker="o", ms=3, label=label,
              color=cmap(i / max(len(curves) - 1, 1)))
  ax.set(title=f"Held-out accuracy per {'task' if tasks else 'bin'} (greedy)",
         xlabel="RL step", ylabel="accuracy (%)", ylim=(-2, 102))
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, ncol=2, loc="center left", bbox_to_anchor=(1.0, 0.5))


def _curriculum_panel(ax, rows, arm_names, tasks, cmap) -> None:
  """The curriculum's probability (or batch share) per arm, or per task of a mixture, stacked."""
  has_probs = any("curriculum/probs/0" in r for r in rows)
  key = "curriculum/probs" if has_probs else "curriculum/arm_frac"
  curves = [_series(rows, f"{key}/{k}") for k in range(len(arm_names))]
  labels = list(arm_names)
  if tasks and curves and curves[0][0].size:  # the mass of each task's arms
    curves = [(curves[0][0], v) for v in task_mass([v for _, v in curves], arm_names, tasks)]
    labels = list(tasks)
  if curves and curves[0][0].size:
    steps = curves[0][0]
    stack = np.stack([_smooth(v, 5) for _, v in curves])
    ax.stackplot(steps, stack, labels=labels,
                 colors=[cmap(i / max(len(labels) - 1, 1)) for i in range(len(labels))])
    ax.set_ylim(0, 1)
  unit = "task" if tasks else "arm"
  ax.set(title=f"Curriculum: probability per {unit}" if key.endswith("probs") else
         f"Curriculum: batch share per {unit}", xlabel="RL step", ylabel="probability")
  ax.legend(fontsize=7, loc="upper right")


def _reward_panel(ax, rows) -> None:
  """The batch's mean reward and correctness, raw and smoothed."""
  for name, label in [("reward_mean", "reward"), ("correct_mean", "correct")]:
    steps, values = _series(rows, name)
    if steps.size:
      (line,) = ax.plot(steps, _smooth(values, 10), label=f"{label} (10-step mean)")
      ax.plot(steps, values, alpha=0.25, color=line.get_color())
  ax.set(title="Training reward", xlabel="RL step", ylabel="mean over batch")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)


def _signal_panel(ax, rows) -> None:
  """The share of groups with a nonzero advantage, and the KL to the reference when measured."""
  steps, values = _series(rows, "nonzero_adv_frac")
  if steps.size:
    ax.plot(steps, values, alpha=0.25, color="tab:red")
    ax.plot(steps, _smooth(values, 10), color="tab:red", label="groups with signal")
  steps, values = _series(rows, "kl")
  if steps.size:
    twin = ax.twinx()
    twin.plot(steps, values, color="tab:gray", alpha=0.7, label="KL to reference")
    twin.set_ylabel("KL to reference (gray)")
  ax.set(title="Share of groups with non-zero advantage (red)", xlabel="RL step", ylabel="fraction",
         ylim=(-0.02, 1.02))
  ax.grid(alpha=0.3)


def write_report(workdir: str, rows: Sequence[dict], *, bin_names: Sequence[str],
                 arm_names: Sequence[str], title: str = "rl_curriculum run",
                 table: Optional[str] = None, tasks: Sequence[str] = ()) -> dict:
  """Writes workdir/report.png and workdir/report.html; returns their paths. With `tasks` (a run
  on several tasks) the accuracy and curriculum panels show tasks instead of bins and arms."""
  fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
  cmap = plt.get_cmap("viridis")
  _accuracy_panel(axes[0, 0], rows, bin_names, tasks, cmap)
  _curriculum_panel(axes[0, 1], rows, arm_names, tasks, cmap)
  _reward_panel(axes[1, 0], rows)
  _signal_panel(axes[1, 1], rows)
  fig.suptitle(title)
  fig.tight_layout()
  png = os.path.join(workdir, "report.png")
  fig.savefig(png, dpi=110)
  plt.close(fig)

  page = os.path.join(workdir, "report.html")
  with open(page, "w") as f:
    f.write(f"<html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head><body>"
            f"<h1>{html.escape(title)}</h1><img src='report.png' style='max-width:100%'>")
    if table:
      f.write(f"<h2>Held-out accuracy</h2><pre>{html.escape(table)}</pre>")
    f.write("</body></html>\n")
  return {"png": png, "html": page}
