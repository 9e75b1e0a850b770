"""The SEC paper's Countdown setting: Qwen2.5-3B, RLOO-style group advantages, SEC over bins.

Chen et al. 2025, "Self-Evolving Curriculum for LLM Reasoning": 256 prompts x 8 completions a
step, 240 steps, the curriculum choosing among difficulty bins. Launch (docs/scaling.md):

  # 8-GPU host, one process, FSDP over the 8 GPUs:
  python -m experiments.train --config configs/sec_paper_countdown_qwen3b.py \
      --workdir /ckpt/sec_countdown --config.model.source=/models/Qwen2.5-3B-Instruct
  # TPU v4-32 / v5p-32 slice (4 hosts): the same command on every host, with
      --config.parallel.num_processes=0            # JAX finds the slice's hosts itself

Memory and a bound on speed, from the TPU compiler on any host (docs/scaling.md):
  python -m experiments.plan --config configs/sec_paper_countdown_qwen3b.py --target v5e-8
compiles every program of a step for a v5e-8 slice by XLA:TPU, without weights (the shape comes
from `model.source`'s config.json, or from `model.preset`), and says whether they fit: on a v5e-8
every program does (learn 12.71 GiB a chip against 15.75; decode 12.94), and on a v6e-8 or a
v5p-8. What brings them that far: bfloat16 compute on float32 master parameters and Adam moments,
scanned layers (one compiled block), each block rematerialised in the backward pass, gradient
accumulation over `rl.microbatches`, optimizer steps guarded one by one (`rl.rollback`: no copy
of the train state), blockwise attention (splash on a TPU), the continuous rollout engine on a
paged KV cache (1024 decode slots for 2048 rows on the pages of a dense 512-slot cache, each
prompt's pages shared by its group), the output head in chunks of `rl.logits_chunk` positions (no
[rows, T, vocab] logits), and vocabulary-parallel in the policy loss (each device computes the
logits and the head gradient of its share of the vocabulary). The engine decodes its own copy
of the weights, split over a tensor axis of 2 and made once a step (`parallel.rollout_layout=
auto`: no weight gathered in the decode loop), and the old policy's log-probs are the sampler's
(`rl.proximal=loglinear`, on-policy: no old-policy pass). The step's bound on a v5e-8, every
kernel counted: 115.3 s (decode 53.4, learn 61.7), against a physical limit of 37.5 s.

Not measured: nothing in this file has been run at this size (the planner compiles it for TPU
slices on a CPU host);
the numbers below are the paper's setting, the rest are this project's defaults.
"""

from configs import scratch


def get_config():
  c = scratch.get_config()
  c.task.name = "countdown"
  c.task.template = "chat"            # the instruct checkpoint's chat template
  c.task.train_bins = (0, 1, 2)       # n3, n4, n5: three to five source numbers
  c.task.eval_bins = (0, 1, 2)
  c.task.train_per_bin = 10_000
  c.task.eval_per_bin = 256
  c.task.format_bonus = 0.1

  c.model.source = ""                 # REQUIRED to train:
                                      # --config.model.source=/path/to/Qwen2.5-3B(-Instruct)
  c.model.preset = "qwen2_5_3b"       # the shape the planner uses without a checkpoint
  c.model.dtype = "bfloat16"          # compute: activations and matmuls
  c.model.param_dtype = "float32"     # master parameters and Adam moments
  c.model.scan_layers = True          # one compiled block for the 36 layers
  c.model.remat = "block"             # keep only each block's input for the backward pass
  c.model.attention = "auto"          # on a TPU its kernels (splash for the learn step, ragged
                                      # paged attention for decode), elsewhere the reference
  c.model.attention_block = 512       # reference: keys in blocks of 512 (memory linear in T)
  c.model.lora_rank = 0               # full fine-tuning, as in the paper

  c.sft.steps = 0                     # the pretrained model needs no warm start

  c.rl.algorithm = "rloo"
  c.rl.steps = 240                    # paper
  c.rl.prompts_per_step = 256         # paper: P
  c.rl.group_size = 8                 # paper: G (2048 completions a step)
  c.rl.max_new_tokens = 1024          # Countdown reasoning traces; the cache and logits scale
                                      # with it
  c.rl.temperature = 1.0
  c.rl.learning_rate = 1e-6           # this project's choice for full fine-tuning of a 3B model
  c.rl.epochs = 1
  c.rl.minibatches = 8                # 32 prompts x 8 = 256 rows per optimizer step
  c.rl.microbatches = 16              # 2 prompts x 8 = 16 rows per forward/backward pass
  c.rl.logits_chunk = 128             # completion positions per chunk of the output head
  c.rl.engine = "continuous"          # decode slots refilled from a queue of rows; each prompt's
                                      # keys and values once per group
  c.rl.decode_slots = 1024            # half the 2048 rows: 128 slots per device on 8
  c.rl.page_size = 16                 # a paged KV cache: pages taken as rows grow
  c.rl.kv_pages = 32768               # the dense cache of 512 slots x 1024 tokens, shared by
                                      # twice the slots (a row past its share restarts)
  c.rl.prefill_chunk = 128            # prompts prefilled 128 positions at a time
  c.rl.kl_coef = 0.0
  c.rl.max_kl = 0.0                   # 0 = no KL-based rollback
  c.rl.rollback = "minibatch"         # a non-finite optimizer step is not applied; no copy of
                                      # the train state (4.9 GiB a chip on v5e-8) is held
  c.rl.proximal = "loglinear"         # synchronous: the old policy's log-probs are the sampler's
                                      # (no old-policy pass; their gap to the learner's is the
                                      # sampler_logp_gap metric)

  c.curriculum.name = "sec"
  c.curriculum.options.alpha = 0.5
  c.curriculum.options.temperature = 1.0
  c.curriculum.options.objective = "abs_advantage"  # SEC's learning-gain proxy

  c.eval.every = 20
  c.eval.batch_size = 256
  c.checkpoint.every = 20
  c.checkpoint.keep = 3

  c.parallel.mesh_shape = (1, -1, 1)  # FSDP over every device; 2048 rows split evenly over 8-64
  c.parallel.rollout_layout = "auto"  # the engine's own copy of the weights, made once a step
                                      # (v5e-8: tensor over 2, 2.87 GiB a chip; the decode loop
                                      # gathers no weight)
  return c
