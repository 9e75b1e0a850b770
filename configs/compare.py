"""Settings of the curriculum comparison: the config every compared run starts from.

  python -m experiments.studies.compare_curricula --config configs/compare.py:scratch --seeds=5
  python -m experiments.studies.compare_curricula --config configs/compare.py:countdown --seeds=5 \
      --lr_sweep=2e-5,4e-5
  python -m experiments.studies.compare_curricula --config configs/compare.py:toy \
      --methods=uniform,sec --seeds=2 --lr_sweep=2e-5 --workdir=/tmp/compare --out=/tmp/compare

The text after ":" picks the setting (one of VARIANTS) and names its run folders (WORKDIR/NAME)
and summary files (OUT/curricula_NAME.*). Per run, experiments/studies/compare_curricula.py sets the
curriculum, the RL seed, the learning rate, and the steps that spend the rollout budget, whose
default is this config's rl.steps x rl.prompts_per_step x rl.group_size. Overrides such as
`--config.rl.group_size=4` change every run: give such a comparison its own --workdir.

- scratch: configs/scratch.py (the arithmetic ladder, the tiny model and its SFT warm start),
  RLOO, 80 steps of 16 prompts x 8 = 10,240 rollouts a run, evaluated every 1,280. Measured on
  the disjoint held-out sets (uniform and SEC at 2e-5, 5 seeds;
  benchmarks/results/curricula_scratch.md): every run starts at 75.8%; uniform ends at 76.4%
  [75.8, 76.9], SEC at 75.9% [75.0, 76.7], paired difference +0.5 [-0.5, +1.6] points; about 2
  minutes a run on one core. (Before the sets were disjoint, SEC's 82.8% against uniform's
  79.1% came from memorised one-digit products: curricula_scratch_2026-12-01.md.)
- countdown: three to five source numbers (no out-of-distribution bin) with the tiny model trained
  here, 20-token completions, 100 steps = 12,800 rollouts a run. Measured on the disjoint
  held-out sets (uniform at 2e-5, SEC at 4e-5, 5 seeds; benchmarks/results/curricula_countdown.md):
  every run starts at 10.2%; uniform ends at 12.3% [11.9, 12.8], SEC at 13.7% [13.0, 14.5],
  paired difference -1.4 [-2.9, +0.1] points, its rates chosen on the reported problems and its
  interval with the seed term clipped at zero (superseded by countdown_prereg); about 17 minutes a
  run on one core. (Ten methods on the older splits ended within 1.5 points of 14%:
  curricula_countdown_2026-11-30.md.)
- countdown_prereg: countdown chosen and reported apart, the setting of the pre-registered
  comparison (docs/preregistration/countdown.md): the runs evaluate on the validation half of
  the held-out prompts (200 a bin, every 10 steps; learning rates are chosen on it), and each
  run's last checkpoint answers the test half once, after every choice (700 a bin:
  --test_per_bin=700, 2,100 problems of the trained bins). Two evaluation-only bins: n6 (one
  source more than trained) and n3_wide (three sources from [31, 99]); the test split adds a
  third, n3_big (targets from 1,000 to 9,999: --test_ood_bins=n3_big), its OOD bin of record.
  Measured (5 seeds a cell; rates chosen on validation: uniform 2e-5, SEC 2e-5, learnability
  1e-5; benchmarks/results/curricula_countdown_prereg.md): from a warm start at 10.0% on the test
  split, uniform ends at 12.3%, SEC at 12.2%, learnability at 11.9%; SEC - uniform = -0.1 [-0.8,
  +0.7] points paired over 2,100 test problems; about 4.5 minutes a run on one core.
- countdown_nobonus: countdown with task.format_bonus = 0, the reward correctness alone, to see
  how much of the curricula's signal on countdown was the bonus for a well-formed wrong answer.
  Its SFT warm start is countdown's (the bonus acts in RL only and is not in the fingerprint), so
  a symlink of one setting's base/ files into the other's skips the 1,500 SFT steps (about an
  hour on one core). Measured (5 seeds, uniform at 2e-5, SEC at 4e-5, both settings from
  one warm start at 9.1%): groups with signal fall from 48% to 29% under uniform, the share with
  mixed correctness (29%) does not move, and final accuracy does not change beyond noise (uniform
  11.2% -> 11.9%, SEC 11.7% -> 10.8%).
- multitask: configs/multitask.py (countdown, zebra and ARC-1D in eight (task, bin) arms, 900 SFT
  steps), 64 steps of 16 prompts x 8 = 8,192 rollouts a run, 200 held-out problems per bin
  evaluated every 2,048 rollouts; "sec" has the eight (task, bin) arms, "sec_tasks" one arm per
  task. Measured (5 seeds; uniform at 2e-5 and 4e-5, the others at 2e-5): every run starts at
  26.9% held-out accuracy; uniform ends at 28.3% [27.5, 29.2], SEC at 28.7% [27.6, 29.8], the
  others at 27.7-28.3%, all within noise; about 5 minutes a run on one core. Rerun, uniform and
  SEC only, from a warm start retrained at 24.3%: uniform 27.1%, SEC 27.3%, paired difference
  -0.2 [-1.3, +1.0] points (benchmarks/results/curricula_multitask.md; the six-method tables are
  curricula_multitask_2026-12-02.*).
- quickstart: configs/quickstart.py (SmolLM2-135M-Instruct, LoRA, no SFT), 30 steps of 8 prompts
  x 4 = 960 rollouts a run, 200 held-out problems a bin evaluated before and after RL only (an
  evaluation of 1,000 problems takes about two minutes, as long as ten RL steps); about 11
  minutes a run on 2 cores. Its learning rate is the quickstart's: --lr_sweep=2e-4.
- toy: the toy config, seconds a run and nothing learned; for tests of the script.
"""

from typing import Optional

import ml_collections

from configs import multitask
from configs import quickstart
from configs import scratch
from configs import toy

VARIANTS = ("scratch", "countdown", "countdown_prereg", "countdown_nobonus", "multitask",
            "quickstart", "toy")


def get_config(arg: Optional[str] = None) -> ml_collections.ConfigDict:
  """The config of the setting `arg`, one of VARIANTS.

  Raises:
    ValueError: `arg` names no setting.
  """
  if arg not in VARIANTS:
    raise ValueError(f"configs/compare.py takes a setting, one of {VARIANTS}, after a colon: "
                     f"--config configs/compare.py:scratch (got {arg!r})")
  if arg == "toy":
    c = toy.get_config()
    c.eval.every = 2
    c.checkpoint.every = 4
    return c
  if arg == "quickstart":
    c = quickstart.get_config()
    c.checkpoint.every = c.rl.steps  # one checkpoint, at the end
    return c
  if arg == "multitask":
    c = multitask.get_config()
    c.rl.steps = 64                 # 64 x 16 prompts x 8 = 8,192 rollouts a run
    c.eval.every = 16               # every 2,048 rollouts
    c.checkpoint.every = 32
    return c
  c = scratch.get_config()
  c.rl.steps = 80                   # 80 x 16 prompts x 8 completions = 10,240 rollouts a run
  c.rl.prompts_per_step = 16
  c.eval.every = 10                 # every 1,280 rollouts
  c.eval.batch_size = 256
  c.checkpoint.every = 50
  if arg in ("countdown", "countdown_prereg", "countdown_nobonus"):
    c.task.name = "countdown"
    c.task.train_bins = (0, 1, 2)   # n3, n4, n5: three to five source numbers
    c.task.eval_bins = (0, 1, 2)    # the task has no out-of-distribution bin
    c.task.eval_per_bin = 128
    c.rl.max_new_tokens = 20        # the answer is an expression over the sources
    c.rl.steps = 100                # 12,800 rollouts a run
    if arg == "countdown_prereg":
      c.task.options = {"countdown": {"ood_bins": True}}
      c.task.eval_bins = (0, 1, 2, 3, 4)  # n3, n4, n5 and the evaluation-only n6, n3_wide
      c.task.held_out_split = "validation"
      c.task.eval_per_bin = 200
    if arg == "countdown_nobonus":
      c.task.format_bonus = 0.0     # reward = correctness alone: no signal from formatting
  return c
