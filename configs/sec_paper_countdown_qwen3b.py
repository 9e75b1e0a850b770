"""The SEC paper's Countdown setting: Qwen2.5-3B, RLOO-style group advantages, SEC over bins.

Chen et al. 2025, "Self-Evolving Curriculum for LLM Reasoning": 256 prompts x 8 completions a
step, 240 steps, the curriculum choosing among difficulty bins. Launch (docs/scaling.md):

  # 8-GPU host, one process, FSDP over the 8 GPUs:
  python experiments/train.py --config configs/sec_paper_countdown_qwen3b.py \
      --workdir /ckpt/sec_countdown --config.model.source=/models/Qwen2.5-3B-Instruct
  # TPU v4-32 / v5p-32 slice (4 hosts): the same command on every host, with
      --config.parallel.num_processes=0            # JAX finds the slice's hosts itself

What exists in the trainer today and what does not (read before launching):
- exists: HF Qwen2 checkpoints (`model.source`), chat prompts, the countdown task with bins
  n3/n4/n5, RLOO advantages, SEC, sharded sampling and learning on a (data, fsdp, tensor) mesh,
  multi-host start-up, Orbax checkpoints written and restored by every process.
- missing: gradient accumulation (here `rl.minibatches` are separate optimizer steps, as in PPO),
  so a step of 2048 completions needs enough minibatches to fit the full [rows, T, V] logits of
  one minibatch (see docs/scaling.md for the arithmetic); chunked log-probs over the vocabulary in
  the learn step; rematerialisation (activation checkpointing) in the model; a separate float32
  master copy of bfloat16 parameters; placement of pretrained weights straight onto the mesh
  (`prepare` loads them on one device, then the loop shards them: fine for 3B on an 80 GB GPU or
  a 32 GB TPU v4 chip in bfloat16, not for much larger models).
- not measured: nothing in this file has been run at this size on these machines (CPU only);
  the numbers below are the paper's setting, the rest are this project's defaults.
"""

from configs import quickstart


def get_config():
  c = quickstart.get_config()
  c.task.name = "countdown"
  c.task.template = "chat"            # the instruct checkpoint's chat template
  c.task.train_bins = (0, 1, 2)       # n3, n4, n5: three to five source numbers
  c.task.eval_bins = (0, 1, 2)
  c.task.train_per_bin = 10_000
  c.task.eval_per_bin = 256
  c.task.format_bonus = 0.1

  c.model.source = ""                 # REQUIRED: --config.model.source=/path/to/Qwen2.5-3B(-Instruct)
  c.model.dtype = "bfloat16"          # parameters and activations (no float32 master copy yet)
  c.model.lora_rank = 0               # full fine-tuning, as in the paper

  c.sft.steps = 0                     # the pretrained model needs no warm start

  c.rl.algorithm = "rloo"
  c.rl.steps = 240                    # paper
  c.rl.prompts_per_step = 256         # paper: P
  c.rl.group_size = 8                 # paper: G (2048 completions a step)
  c.rl.max_new_tokens = 1024          # Countdown reasoning traces; the cache and logits scale with it
  c.rl.temperature = 1.0
  c.rl.learning_rate = 1e-6           # this project's choice for full fine-tuning of a 3B model
  c.rl.epochs = 1
  c.rl.minibatches = 64               # 32 prompts x 8 = 256 rows per optimizer step (memory)
  c.rl.kl_coef = 0.0
  c.rl.max_kl = 0.0                   # 0 = no KL-based rollback

  c.curriculum.name = "sec"
  c.curriculum.options.alpha = 0.5
  c.curriculum.options.temperature = 1.0
  c.curriculum.options.objective = "abs_advantage"  # SEC's learning-gain proxy

  c.eval.every = 20
  c.eval.batch_size = 256
  c.checkpoint.every = 20
  c.checkpoint.keep = 3

  c.parallel.mesh_shape = (1, -1, 1)  # FSDP over every device; 2048 rows split evenly over 8-64
  return c
