"""Compares category-level curricula on the simulated learner.

  python -m experiments.studies.curriculum_gym --setting=ladder6_unlearnable_top --seeds=64 \
      --out=benchmarks/results/

Runs every curriculum in `CURRICULA` for S seeds on a named setting of `rl_curriculum.curriculum.
gym` and writes `curriculum_gym.md`, `.json` and `.png` to --out (default workdirs/curriculum_gym/;
the committed results are those of --out=benchmarks/results/; the setting's name is appended to the
file names for settings other than the default). Each curriculum compiles once and runs all its
seeds in one vmapped program: about 4 s a curriculum on 2 cores, a minute or two in all. The table
gives, per curriculum, the steps to reach the setting's mean-success target (median over seeds), the
final mean success over learnable bins, the share of batch slots whose group carried a non-zero
advantage, and the share of slots spent on unlearnable bins over the last quarter of the run. The
plot shows the mean share of slots per bin over training. A timing of SEC's select + update at
K = 16, P = 512 is appended.
Expect a few minutes on 2 CPU cores.
"""

import json
import os
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

from rl_curriculum import curriculum
from rl_curriculum.curriculum import gym
from rl_curriculum.curriculum.base import PromptPool
from rl_curriculum.types import Feedback

matplotlib.use("Agg")
from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS

DEFAULT_SETTING = "ladder6_unlearnable_top"


# name -> constructor(pool, batch_size). Other modules may add entries before calling `run`.
CURRICULA = {
    "uniform": lambda pool, p: curriculum.uniform(pool, batch_size=p),
    "easy_to_hard": lambda pool, p: curriculum.easy_to_hard(pool, batch_size=p, steps_per_arm=50),
    "easy_to_hard_acc0.8": lambda pool, p: curriculum.easy_to_hard(
        pool, batch_size=p, steps_per_arm=None, accuracy_threshold=0.8),
    "hard_to_easy": lambda pool, p: curriculum.hard_to_easy(pool, batch_size=p, steps_per_arm=50),
    "linear_pacing": lambda pool, p: curriculum.linear_pacing(pool, batch_size=p,
                                                              steps_to_full=150),
    "cyclical": lambda pool, p: curriculum.cyclical(pool, batch_size=p, period=100),
    "mixed_replay": lambda pool, p: curriculum.mixed_replay(pool, batch_size=p, steps_per_arm=50),
    "sec": lambda pool, p: curriculum.sec(pool, batch_size=p),
    "sec_t0.4": lambda pool, p: curriculum.sec(pool, batch_size=p, temperature=0.4),
    "sec_t0.2": lambda pool, p: curriculum.sec(pool, batch_size=p, temperature=0.2),
    "sec_t0.4_decay": lambda pool, p: curriculum.sec(pool, batch_size=p, temperature=0.4,
                                                     unsampled="decay"),
    "sec_t0.4_unnorm": lambda pool, p: curriculum.sec(pool, batch_size=p, temperature=0.4,
                                                      objective="unnormalized_abs_advantage"),
    "sec_t0.4_lp": lambda pool, p: curriculum.sec(pool, batch_size=p, temperature=0.4,
                                                  objective="learning_progress"),
    "sec_eps0.1": lambda pool, p: curriculum.sec(pool, batch_size=p, exploration="epsilon_greedy"),
    "sec_ucb": lambda pool, p: curriculum.sec(pool, batch_size=p, exploration="ucb"),
    "dump": lambda pool, p: curriculum.dump(pool, batch_size=p),
    "alp_teacher": lambda pool, p: curriculum.alp_teacher(pool, batch_size=p),
    "mastering_rate": lambda pool, p: curriculum.mastering_rate(pool, batch_size=p),
    "learnability": lambda pool, p: curriculum.learnability(pool, batch_size=p),
}


def evaluate(name, constructor, config: gym.GymConfig, seeds: int) -> tuple[dict, dict]:
  """Runs one curriculum for `seeds` seeds; returns (summary numbers, mean traces)."""
  pool = gym.make_pool(config)
  cur = constructor(pool, config.batch_size)
  start = time.perf_counter()
  traces = gym.simulate_seeds(cur, config, jax.random.split(jax.random.key(0), seeds))
  traces = jax.tree.map(np.asarray, jax.block_until_ready(traces))
  seconds = time.perf_counter() - start
  steps = gym.steps_to_target(traces["mean_success"], config.target)
  reached = np.isfinite(steps)
  late = (gym.late_mass(traces["arm_freq"], config.unlearnable) if config.unlearnable
          else np.zeros((seeds,)))
  summary = {
      "steps_to_target_median": float(np.median(steps)),  # inf when most seeds never reach it
      "reached_fraction": float(reached.mean()),
      "final_mean_success": float(traces["mean_success"][:, -1].mean()),
      "final_mean_success_std": float(traces["mean_success"][:, -1].std()),
      "signal_fraction": float(traces["signal_frac"].mean()),
      "late_unlearnable_mass": float(late.mean()),
      "late_unlearnable_mass_max_seed": float(late.max()),
      "seconds": seconds,
  }
  means = {"arm_freq": traces["arm_freq"].mean(axis=0),
           "mean_success": traces["mean_success"].mean(axis=0)}
  print(f"{name:22s} {seconds:6.1f}s  steps {summary['steps_to_target_median']:6.1f}  "
        f"final {summary['final_mean_success']:.3f}  "
        f"late dead {summary['late_unlearnable_mass']:.3f}",
        flush=True)
  return summary, means


def benchmark_sec_overhead(num_arms: int = 16, batch_size: int = 512, group_size: int = 8,
                           prompts_per_arm: int = 256, iters: int = 300) -> dict:
  """Wall time of SEC's jitted select + update after compilation, in microseconds per step.

  Each iteration calls the two jitted functions separately (as a trainer does: select before the
  rollout, update after it) and blocks on each result. Returns the median, mean and 10th/90th
  percentiles of the sum over `iters` iterations (the mean includes the steps on which an arm is
  exhausted and reshuffled), and the medians of each call.
  """
  pool = PromptPool.from_arms(np.repeat(np.arange(num_arms), prompts_per_arm))
  cur = curriculum.sec(pool, batch_size=batch_size)
  select, update = jax.jit(cur.select), jax.jit(cur.update)
  state = cur.init(pool, jax.random.key(0))
  rewards = (jax.random.uniform(jax.random.key(1), (batch_size, group_size)) < 0.5)
  rewards = rewards.astype(jnp.float32)
  correct = rewards > 0
  adv = rewards - jnp.mean(rewards, axis=1, keepdims=True)
  # Keys are made before timing: a trainer derives them inside its own jitted step.
  keys = list(jax.random.split(jax.random.key(2), iters + 20))

  def one(state, key):
    t0 = time.perf_counter()
    sel, state = select(state, key)
    jax.block_until_ready((sel, state))
    t1 = time.perf_counter()
    fb = Feedback(prompt_ids=sel.prompt_ids, arms=sel.arms, rewards=rewards, correct=correct,
                  advantages=adv)
    state, metrics = update(state, fb)
    jax.block_until_ready((state, metrics))
    return state, t1 - t0, time.perf_counter() - t1

  for t in range(20):  # compile and warm up
    state, _, _ = one(state, keys[t])
  sel_t, upd_t = [], []
  for t in range(iters):
    state, a, b = one(state, keys[20 + t])
    sel_t.append(a)
    upd_t.append(b)
  sel_t, upd_t = np.array(sel_t) * 1e6, np.array(upd_t) * 1e6
  both = sel_t + upd_t
  return {"num_arms": num_arms, "batch_size": batch_size, "group_size": group_size,
          "pool_size": num_arms * prompts_per_arm, "iters": iters,
          "median_us": float(np.median(both)), "p10_us": float(np.percentile(both, 10)),
          "p90_us": float(np.percentile(both, 90)), "mean_us": float(np.mean(both)),
          "select_median_us": float(np.median(sel_t)),
          "update_median_us": float(np.median(upd_t)), "backend": jax.default_backend()}


def _fmt_steps(s: dict) -> str:
  if not np.isfinite(s["steps_to_target_median"]):
    return f"not reached ({s['reached_fraction']:.0%} of seeds)"
  return f"{s['steps_to_target_median']:.0f} ({s['reached_fraction']:.0%})"


def write_markdown(path, setting, config, seeds, results, bench, total_seconds) -> None:
  base = results["uniform"]["steps_to_target_median"] if "uniform" in results else np.nan
  lines = [
      f"# Curricula on the simulated learner: `{setting}`",
      "",
      f"Command: `python -m experiments.studies.curriculum_gym --setting={setting} --seeds={seeds} "
      f"--steps={config.steps}` ({total_seconds:.0f} s on {jax.default_backend().upper()}, "
      f"compilation included).",
      "",
      f"Setting: {config.num_bins} bins x {config.prompts_per_bin} prompts, P = "
      f"{config.batch_size} prompts x G = {config.group_size} completions a step, "
      f"{config.steps} steps, RLOO advantages, slope a = {config.slope}, learning rate "
      f"{config.learning_rate}, transfer {config.transfer}, unlearnable bins "
      f"{list(config.unlearnable)} ({config.unlearnable_mode}). Target: mean success over "
      f"learnable bins >= {config.target}. {seeds} seeds; means over seeds.",
      "",
      "| curriculum | steps to target: median (seeds reached) | vs uniform | final mean success "
      "| slots with signal | late mass on unlearnable (max seed) |",
      "|---|---|---|---|---|---|",
  ]
  for name, s in results.items():
    ratio = s["steps_to_target_median"] / base if np.isfinite(base) else np.nan
    ratio_txt = f"{ratio:.2f}x" if np.isfinite(ratio) else "-"
    late = (f"{s['late_unlearnable_mass']:.3f} ({s['late_unlearnable_mass_max_seed']:.3f})"
            if config.unlearnable else "-")
    lines.append(f"| {name} | {_fmt_steps(s)} | {ratio_txt} | "
                 f"{s['final_mean_success']:.3f} ± {s['final_mean_success_std']:.3f} | "
                 f"{s['signal_fraction']:.3f} | {late} |")
  lines += [
      "",
      "Columns: steps to target = first step whose mean success over learnable bins reaches the "
      "target (median over seeds); vs uniform = that median over uniform's (below 1 is faster); "
      "slots with signal = share of batch slots whose group had a non-zero advantage, averaged "
      "over the run; late mass = share of slots on unlearnable bins over the last quarter of the "
      "run.",
      "",
      "Notes.",
      "",
  ]
  if config.unlearnable and config.unlearnable_mode == "zero":
    lines += [
        "- SEC at its default temperature 1.0 cannot keep the unlearnable bin below 10% on this "
        "ladder: with RLOO on 0/1 rewards and G = 8 an arm's reward is at most G/(G-1)/2 = 0.571, "
        "so the dead arm (Q = 0) keeps at least 1/(1 + 5 e^0.571) = 10.2% of a softmax(Q/1) over "
        "six arms. The paper used 0.4 on MATH and 0.2 for 2-D arms; both are listed.",
        "- Mastered bins and the unlearnable bin look alike to every |advantage|-based method "
        "(both give all-equal groups), so these late-mass numbers hold while the learner is still "
        "learning; once every learnable bin is mastered, nothing separates them.",
    ]
  if config.unlearnable and config.unlearnable_mode == "noise":
    lines += [
        "- The unlearnable bin's outcomes are coin flips (success 0.5 whatever the learner does): "
        "its groups carry the largest |advantage| of all and teach nothing. Every method that "
        "chases |advantage| (SEC, DUMP, UCB) is drawn to it. Methods scoring learning progress "
        "(SEC's learning_progress objective, the ALP teacher) are drawn less, though sampling "
        "noise in the success windows still reads as progress. Uniform and the fixed schedules "
        "do not read outcomes there, so their rows equal the zero-success setting's.",
    ]
  lines += [
      "- Fixed schedules walk into the top bin and stay there (easy_to_hard, mastering_rate once "
      "the bin below is mastered); that is the failure the adaptive methods avoid.",
      "",
      "![arm shares over training](" + os.path.basename(path).replace(".md", ".png") + ")",
      "",
  ]
  if bench:
    lines += [
        "## Overhead",
        "",
        f"SEC select + update (two jitted calls, blocking) at K = {bench['num_arms']}, P = "
        f"{bench['batch_size']}, G = {bench['group_size']}, pool {bench['pool_size']}: median "
        f"{bench['median_us']:.0f} us (p10 {bench['p10_us']:.0f}, p90 {bench['p90_us']:.0f}, "
        f"mean {bench['mean_us']:.0f}; select {bench['select_median_us']:.0f}, update "
        f"{bench['update_median_us']:.0f}) over {bench['iters']} steps after compilation, "
        f"{bench['backend'].upper()}, 2 cores shared with other jobs (an upper bound). The mean "
        "includes the steps that reshuffle exhausted arms.",
        "",
    ]
  with open(path, "w") as f:
    f.write("\n".join(lines))


def plot(path, setting, config, means) -> None:
  """One panel per curriculum: mean share of slots per bin over training; last: mean success."""
  names = list(means)
  cols = 4
  rows = int(np.ceil((len(names) + 1) / cols))
  fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
  colors = plt.cm.viridis(np.linspace(0.0, 0.9, config.num_bins))
  steps = np.arange(1, config.steps + 1)
  width = 10  # moving average over steps, for readability
  kernel = np.ones(width) / width
  for ax, name in zip(axes.flat, names):
    freq = means[name]["arm_freq"]
    smooth = np.stack([np.convolve(np.pad(freq[:, k], (width - 1, 0), mode="edge"), kernel,
                                   mode="valid") for k in range(config.num_bins)])
    labels = [f"bin {k}" + (" (unlearnable)" if k in config.unlearnable else "")
              for k in range(config.num_bins)]
    ax.stackplot(steps, smooth, colors=colors, labels=labels)
    ax.set_title(name)
    ax.set_xlim(1, config.steps)
    ax.set_ylim(0, 1)
    ax.set_xlabel("step")
    ax.set_ylabel("share of batch slots")
  ax = axes.flat[len(names)]
  line_colors = plt.cm.tab20(np.linspace(0.0, 1.0, len(names)))
  for name, color in zip(names, line_colors):
    ax.plot(steps, means[name]["mean_success"], label=name, lw=1, color=color)
  ax.axhline(config.target, color="k", ls=":", lw=1, label="target")
  ax.set_title("mean success, learnable bins")
  ax.set_xlabel("step")
  ax.set_ylabel("success probability")
  spare = list(axes.flat)[len(names) + 1:]
  for extra in spare:
    extra.axis("off")
  if spare:  # the success curves' legend goes into the first empty panel
    spare[0].legend(*ax.get_legend_handles_labels(), loc="center", fontsize=7, ncol=2,
                    title="mean success panel")
  else:
    ax.legend(fontsize=5.5, ncol=2, loc="lower right")
  handles, labels = axes.flat[0].get_legend_handles_labels()
  fig.suptitle(f"{setting}: share of batch slots per difficulty bin (mean over seeds, "
               f"{width}-step moving average)", y=0.995)
  fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.975),
             ncol=config.num_bins, fontsize=9)
  fig.tight_layout(rect=(0, 0, 1, 0.95))
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _finite(x):
  """JSON-safe copy: tuples become lists, non-finite floats become None."""
  if isinstance(x, dict):
    return {k: _finite(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_finite(v) for v in x]
  if isinstance(x, float) and not np.isfinite(x):
    return None
  return x


def run(setting: str, seeds: int, steps, out: str, benchmark: bool) -> dict:
  config = gym.SETTINGS[setting]
  if steps is not None:
    config = config._replace(steps=steps)
  os.makedirs(out, exist_ok=True)
  stem = "curriculum_gym" if setting == DEFAULT_SETTING else f"curriculum_gym_{setting}"
  start = time.perf_counter()
  results, means = {}, {}
  for name, constructor in CURRICULA.items():
    results[name], means[name] = evaluate(name, constructor, config, seeds)
  total = time.perf_counter() - start
  bench = benchmark_sec_overhead() if benchmark else None
  if bench:
    print(f"SEC select + update, K=16, P=512: median {bench['median_us']:.0f} us", flush=True)
  write_markdown(os.path.join(out, stem + ".md"), setting, config, seeds, results, bench, total)
  plot(os.path.join(out, stem + ".png"), setting, config, means)
  record = {"setting": setting, "config": config._asdict(), "seeds": seeds, "results": results,
            "benchmark": bench}
  with open(os.path.join(out, stem + ".json"), "w") as f:
    json.dump(_finite(record), f, indent=1)
  return record


def define_flags() -> None:
  """The command's flags; defined when it runs, so that importing this module defines none."""
  flags.DEFINE_enum("setting", DEFAULT_SETTING, sorted(gym.SETTINGS),
                    "Named gym setting.")
  flags.DEFINE_integer("seeds", 64, "Seeds per curriculum.")
  flags.DEFINE_integer("steps", None, "Steps per run; default: the setting's.")
  flags.DEFINE_string("out", "workdirs/curriculum_gym/",
                      "Output folder (benchmarks/results/ refreshes the committed results).")
  flags.DEFINE_bool("benchmark", True, "Also time SEC select + update (K=16, P=512).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  run(FLAGS.setting, FLAGS.seeds, FLAGS.steps, FLAGS.out, FLAGS.benchmark)


if __name__ == "__main__":
  define_flags()
  app.run(main)
