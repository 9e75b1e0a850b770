"""From scratch: a tiny transformer learns the arithmetic ladder by SFT, then RLOO with SEC.

  python -m experiments.train --config configs/scratch.py --workdir workdirs/scratch

The base config: every field of every config is set and documented here, and the other configs
start from this one (the quickstart puts SmolLM2-135M-Instruct in the model's place). This
setting is the tests', the notebooks' and most comparisons' small model.

What it does: trains a SentencePiece tokenizer and a ~3M-parameter transformer from scratch on
the arithmetic ladder (a short SFT warm start, cached in the workdir), then runs RL with RLOO
advantages while the Self-Evolving Curriculum picks which difficulty bin each prompt comes from.
Held-out greedy accuracy per bin (out-of-distribution bins included) is evaluated periodically;
the run ends with a before/after table and workdir/report.png.

Expected (measured with this file on ONE core of a 2-core CPU, the other core busy): about 12.5
minutes in all (SFT ~6 min, RL 1.0 s a step). Held-out greedy accuracy (problems neither SFT nor RL
saw) after SFT -> after RL: two-digit sums and differences 96-98% throughout, two-digit x one-digit
products 12% -> 8%, one-digit products 13% -> 33% and one-digit sums 64% -> 64% on 15 and 22
held-out problems (too few to compare), three-term and out-of-distribution bins near 0: no gain
beyond noise on unseen problems, while batch accuracy on the practised prompts rises 66% -> 74%.
The warm start repeats exactly on one machine, but not across machines: XLA:CPU picks its kernels
by the CPU (vector width, cache blocking) and splits reductions by the thread count, so float
rounding differs, and 1,500 SFT steps amplify it into other greedy answers; two 2-core machines
gave two-digit sums (add_2d_2d) 83.6% and 97.7% held out after SFT. Compare runs made from one
warm start (experiments.studies.compare_curricula does: one per setting), not numbers from two
machines.
Overrides: --config.rl.steps=50 --config.curriculum.name=uniform --config.curriculum.options={}
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0  # root of every random stream: fold_in(root, step) per step

  c.task = ml_collections.ConfigDict()
  c.task.name = "arithmetic"        # rl_curriculum.tasks.get_task name; several joined by "+"
                                    # ("countdown+zebra") are one mixture whose bins are the
                                    # (task, bin) pairs (configs/multitask.py)
  c.task.weights = ()               # mixture only: each task's share of the RL pool (relative,
                                    # one per task; () = train_per_bin in every bin)
  c.task.options = ml_collections.ConfigDict()  # {task name: its options}, e.g.
                                    # {"arc1d": {"num_shots": 1}} (rl_curriculum.tasks)
  c.task.template = "plain"         # plain (models trained here) | chat (instruct checkpoints)
  c.task.train_bins = (0, 1, 2, 3, 4, 5)  # bins the curriculum chooses among (its arms)
  # Held-out evaluation: the six training bins, two harder bins never trained on (6, 7: three-term
  # expressions), and the task's evaluation-only out-of-distribution bins (8-11).
  c.task.eval_bins = tuple(range(12))
  c.task.train_per_bin = 2000       # problems per bin in the RL pool
  c.task.sft_per_bin = 2000         # problems per bin for the SFT warm start (disjoint seeds)
  c.task.eval_per_bin = 128         # held-out problems per bin (fewer where the bin is small)
  # Share of every training bin's problem space kept for evaluation (a fixed hash of the prompt):
  # RL and SFT never see those prompts, so the 100 one-digit sums train on 78 and hold out 22.
  c.task.held_out_fraction = 0.2
  # Which held-out prompts the run evaluates on: "all" of them, or one of two hash-disjoint halves,
  # "validation" (the sets a sweep chooses by) or "test" (reported, never chosen by).
  c.task.held_out_split = "all"
  c.task.format_bonus = 0.1         # reward for a well-formed wrong answer

  c.model = ml_collections.ConfigDict()
  c.model.source = ""               # "" = build `preset` from scratch; else an HF folder, a
                                    # .gguf file or "smollm2-135m-instruct" (load_pretrained)
  c.model.preset = "tiny"           # rl_curriculum.model presets (tiny is trained here)
  c.model.dtype = "float32"         # float32 | bfloat16: activations and matmuls (compute)
  c.model.param_dtype = "float32"   # float32 | bfloat16: stored parameters and Adam moments;
                                    # bfloat16 compute on float32 master weights: dtype=bfloat16
  c.model.scan_layers = False       # the block stack as one scanned block (compile time does
                                    # not grow with depth; same values)
  c.model.remat = "none"            # none | block | dots: recompute each block in the backward
                                    # pass instead of keeping its activations (same values)
  c.model.attention = "reference"   # reference (pure JAX) | tpu (splash, ragged paged attention
                                    # kernels) | auto (tpu on a TPU, reference elsewhere)
  c.model.attention_block = 0       # reference: keys per block of the prefill/learn attention
                                    # (0 = each layer's [T, T] scores whole; > 0 = blockwise,
                                    # memory linear in T)
  c.model.kv_dtype = ""             # the KV cache's dtype: "" = model.dtype, or float32
  c.model.lora_rank = 0             # 0 = full fine-tuning; > 0 = LoRA adapters only
  c.model.lora_alpha = 16.0         # LoRA scale is lora_alpha / lora_rank
  c.model.lora_targets = ("q", "v")  # projections that get adapters when lora_rank > 0
  c.model.lora_merge_every = 0      # ReLoRA: merge the adapters into the base and restart them
                                    # every this many RL steps (0 = off; needs lora_rank > 0)

  c.tokenizer = ml_collections.ConfigDict()
  c.tokenizer.vocab_size = 64       # soft limit; digits are split into single pieces
  c.tokenizer.model_type = "unigram"  # unigram | bpe (SentencePiece; BPE merges whole words of
                                    # long instructions, about half the tokens of unigram's)

  c.sft = ml_collections.ConfigDict()
  c.sft.steps = 1500                # 0 skips the warm start
  c.sft.batch_size = 64             # sequences per SFT step
  c.sft.learning_rate = 1e-3        # peak; warmup then cosine decay to a tenth
  c.sft.warmup_steps = 100          # linear warmup (capped at half of sft.steps)
  c.sft.save_every = 250            # save SFT's progress every this many steps (0 = never), so
                                    # a killed warm start resumes there, to the same result

  c.rl = ml_collections.ConfigDict()
  c.rl.algorithm = "rloo"           # rloo | grpo | dr_grpo | reinforce_pp | ppo (critic + GAE)
                                    # | counterfactual (A = r - the prompt's past success rate)
  c.rl.steps = 150                  # RL updates (one rollout batch each)
  c.rl.seed = 0                     # RL randomness (rollouts, curriculum): 0 = `seed` alone, else
                                    # folded into it; data and SFT warm start do not depend on it
  c.rl.prompts_per_step = 32        # P
  c.rl.group_size = 8               # G completions per prompt
  c.rl.allocation = "none"          # none | uniform | variance | difficulty: spread the step's
                                    # S x G completions over its prompts (variance: more where
                                    # the Beta posterior of success is widest; difficulty: more
                                    # where success is rare); none = G each
  c.rl.allocation_max = 16          # with an allocation: completion slots per prompt (>= G)
  c.rl.allocation_min = 2           # with an allocation: fewest completions a prompt gets
  c.rl.max_new_tokens = 6           # completion length cap (answer + EOS)
  c.rl.engine = "static"            # rollout engine: static (a decode row per rollout row until
                                    # the step's longest completion ends) | continuous (a fixed
                                    # number of decode slots refilled from a queue of rows, each
                                    # prompt's keys and values stored once per group)
  c.rl.decode_slots = 64            # continuous: decode slots (a multiple of data x fsdp)
  c.rl.decode_shrink = 3            # continuous: halve the slots up to this many times once the
                                    # rows left fit (the tail's slot-steps; same tokens; 0 = fixed)
  c.rl.prefill_chunk = 0            # prompt positions per prefill pass (0 = the whole prompt;
                                    # at most the prompt buffer)
  c.rl.page_size = 0                # continuous: tokens a KV page (0 = each slot a dense cache
                                    # of max_new_tokens; > 0 = a paged cache, pages taken as rows
                                    # grow, a group's prompt pages shared)
  c.rl.kv_pages = 0                 # paged: completion pages in the pool (0 = enough for every
                                    # slot to run to max_new_tokens; fewer: rows that run out
                                    # restart, the furthest along never)
  # Multi-turn episodes: read when the task is an environment (calculator, countdown_tool, guess;
  # docs/environments.md), whose rows are episodes on the continuous engine with a paged cache.
  c.rl.max_turns = 4                # H: turns of the policy an episode may take (the horizon
                                    # curriculum's largest)
  c.rl.turn_tokens = 0              # tokens one turn may draw (0 = rl.max_new_tokens); the whole
                                    # episode, turns and observations, has rl.max_new_tokens
  c.rl.observation_tokens = 32      # ids one observation may take, its chat framing included
                                    # (a longer one loses its middle, head and tail kept)
  c.rl.credit = "episode"           # what an episode's drawn tokens carry: episode (the group
                                    # advantage of its return, every turn alike) | turn (turn k
                                    # the group advantage of its return to go, episodes compared
                                    # at the same turn; for environments paying rewards a turn)
  c.rl.turn_discount = 1.0          # credit = turn: discount per turn of the returns to go
  # Rollouts in flight across steps (docs/concepts.md#rollouts-overlapped-with-learning; each
  # needs the continuous engine): step t learns from a batch selected and queued at step t - k,
  # while the batches of the next k steps decode.
  c.rl.max_staleness = 0            # k: policy versions a trained token may lag its update
                                    # (0 = synchronous: each step samples, then learns)
  c.rl.decode_budget = 0            # decode iterations a step runs (partial rollouts: rows
                                    # that have not stopped go on at the next step, under its
                                    # weights); 0 = every queued row decodes to its end
  c.rl.admission = "wait"           # a batch whose rows have not all stopped when its step
                                    # comes: wait (decode on until they do) | drop (its
                                    # unfinished groups are discarded; needs k >= 1, a budget)
  c.rl.off_policy_correction = "required"  # with k >= 1: required (rl.tis_cap > 0 or
                                    # rl.proximal = loglinear must weigh the stale tokens) |
                                    # none (train them uncorrected, on purpose)
  c.rl.temperature = 1.0            # sampling temperature; the losses' log-probs are those of
                                    # logits / temperature, the distribution that sampled
  c.rl.learning_rate = 2e-5         # Adam moves every weight ~lr per step: 3e-4 wrecked the SFT
                                    # model
  c.rl.epochs = 1                   # passes over each rollout batch
  c.rl.minibatches = 2              # optimizer steps per epoch; P must divide by it
  c.rl.microbatches = 1             # gradient accumulation: forward/backward passes per
                                    # optimizer step (same update, 1/k of the activations)
  c.rl.logits_chunk = 256           # completion positions per chunk of the output head; no
                                    # [rows, T, vocab] logits exist beyond one chunk (0 = all)
  c.rl.eps_low = 0.2                # PPO clip range below 1
  c.rl.eps_high = 0.28              # Clip-Higher above 1
  c.rl.level = "token"              # token (PPO) | sequence (GSPO)
  c.rl.aggregation = "token_mean"   # token_mean | seq_mean_token_mean | seq_mean_token_sum_norm
                                    # (dr_grpo requires seq_mean_token_sum_norm)
  c.rl.kl_coef = 0.0                # KL-to-reference loss coefficient (beta)
  c.rl.kl_estimator = "k3"          # k2 | k3 as a loss (k1's gradient has zero mean): k2's
                                    # gradient is that of KL(pi || ref), k3's that of KL(ref || pi)
  c.rl.max_grad_norm = 1.0          # global-norm gradient clipping (0 = off)
  c.rl.whiten_rewards = False       # running mean/std reward whitening
  c.rl.ratio_guard = 10.0           # drop tokens with |log-ratio| above this (0 = off)
  c.rl.max_kl = 5.0                 # roll back an update whose KL(pi_old || pi_new) exceeds
                                    # this (0 = off; on costs one forward pass a step)
  c.rl.rollback = "step"            # step: a non-finite update (or one past max_kl) is
                                    # discarded whole, so the learn step holds a copy of the
                                    # train state; minibatch: each optimizer step is applied only
                                    # if its loss and gradients are finite, no copy (needs
                                    # max_kl = 0)
  c.rl.gamma = 1.0                  # ppo: discount per token
  c.rl.lam = 1.0                    # ppo: GAE lambda; with an untrained critic, lambda < 1
                                    # scales token t's advantage by lambda^(L-1-t) (early tokens
                                    # of long completions get ~0); 1 gives every token r - V(t)
  c.rl.vf_coef = 0.5                # ppo: value-loss weight
  c.rl.vf_clip = 0.2                # ppo: value clipping range
  c.rl.value_detach = True          # ppo: the value loss trains the head only, never the policy
  c.rl.dual_clip = 0.0              # dual-clip PPO: a negative-advantage token's loss is at most
                                    # -dual_clip * A (0 = off, else > 1, e.g. 3)
  c.rl.entropy_coef = 0.0           # entropy bonus: loss -= coef * entropy, aggregated like the
                                    # policy loss (0 = off)
  c.rl.tis_cap = 0.0                # truncated importance sampling: advantages times
                                    # min(pi_old / pi_sampler, cap) per token (0 = off, e.g. 2)
  c.rl.proximal = "recompute"       # the old policy's log-probs: recompute (a forward pass at the
                                    # update's start) | loglinear (interpolated between sampler
                                    # and policy by version, A-3PO; no forward pass)
  c.rl.capo_positive_steps = 0      # CAPO: first updates learn from positive advantages only
  c.rl.capo_ramp_steps = 0          # CAPO: then negative ones phase in over this many updates
                                    # (both 0 = off)
  c.rl.grpo_std = "population"      # grpo: population (divide by n) | sample (n - 1) group std;
                                    # other algorithms ignore it
  c.rl.kl_reward_coef = 0.0         # KL to the reference in the reward (beta): PPO's token
                                    # rewards lose beta * k1 each, a group estimator's completion
                                    # rewards beta * sum k1 (0 = off; on costs a reference pass)
  c.rl.overlong = "none"            # completions cut at max_new_tokens: none | exclude (out of the
                                    # loss, DAPO) | penalty (DAPO's soft length penalty)
  c.rl.overlong_cache = 0           # penalty: lengths past max_new_tokens - this lose up to 1
                                    # reward, linearly (in [1, max_new_tokens) with penalty)
  c.rl.temperature_target = 0.0     # adaptive temperature: entropy per token (nats) to hold; each
                                    # step tau *= exp(rate * (target - entropy)) (0 = off, else
                                    # rl.temperature is where tau starts)
  c.rl.temperature_rate = 0.1       # adaptive temperature: gain (1/nats)
  c.rl.temperature_min = 0.5        # adaptive temperature: lowest tau (<= rl.temperature)
  c.rl.temperature_max = 1.5        # adaptive temperature: highest tau (>= rl.temperature)

  c.curriculum = ml_collections.ConfigDict()
  c.curriculum.name = "sec"         # see rl_curriculum.train.setup.builders.CURRICULA
  c.curriculum.arms = "bin"         # bin: one arm per training bin (on a mixture the (task, bin)
                                    # pairs: 2-D SEC) | task: one arm per task of a mixture
  c.curriculum.options = ml_collections.ConfigDict(dict(  # keyword arguments of that constructor
      alpha=0.5, temperature=0.2, unsampled="keep", objective="abs_advantage"))
  # What the curriculum's advantages are computed from: "correct" (raw correctness) or "reward"
  # (the shaped reward the policy trains on; with a format bonus it rewards formatting too).
  c.curriculum.feedback = "correct"
  c.curriculum.horizon = "fixed"    # episodes' turn limit each step: fixed (rl.max_turns) |
                                    # linear (horizon_start at step 1 up to rl.max_turns at the
                                    # last, TTI) | bandit (Boltzmann over 1 .. rl.max_turns,
                                    # valued by the spread of returns it gave; curriculum.horizon)
  c.curriculum.horizon_start = 1    # linear: the first step's horizon
  c.curriculum.horizon_temperature = 0.1  # bandit: Boltzmann temperature over horizon values
  c.curriculum.horizon_alpha = 0.5  # bandit: TD(0) step size of a horizon's value
  c.curriculum.oversample = 1.0     # > 1 with a filter: roll out P * oversample prompts (whole)
  c.curriculum.filter = "none"      # none | all_equal | accuracy_band (post-rollout filter)
  c.curriculum.band = (0.0, 1.0)    # accuracy band [lo, hi] kept by the accuracy_band filter
  c.curriculum.high_variance_only = False  # vcrl: only the groups its update marks high-variance
                                    # enter the loss (the others still teach the curriculum)
  c.curriculum.features_every = 25  # pcl: recompute prompt features with the current policy
                                    # every this many steps (0 = only at the start)
  c.curriculum.features_batch_size = 512  # pcl: prompts per feature forward pass

  c.eval = ml_collections.ConfigDict()
  c.eval.every = 25                 # RL steps between held-out evaluations (and at 0 and the end)
  c.eval.batch_size = 128           # prompts per greedy evaluation batch
  c.eval.plan_bound = True          # on TPU chips: plan the step at start (one more compile of
                                    # each program) and log its roofline bound beside each
                                    # step's time
  c.eval.min_held_out = 50          # a bin whose problem space leaves it fewer held-out problems
                                    # is flagged "too few to compare" (one problem moves it 2+
                                    # points) and left out of the comparisons' mean gains

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every = 25           # RL steps between checkpoints (and at the end)
  c.checkpoint.keep = 2             # newest checkpoints kept on disk
  c.checkpoint.rollback_after = 0   # after this many skipped updates in a row, restore the newest
                                    # checkpoint saved healthy before them (0 = off)
  c.checkpoint.collapse_after = 3   # after this many steps in a row that look collapsed (a
                                    # policy that became uniform, no gradient despite
                                    # advantages, or the two below), act as on_collapse says
                                    # (0 = off)
  c.checkpoint.on_collapse = "rollback"  # rollback: to the newest healthy checkpoint from before
                                    # the collapse (none, or the same one again: stop); stop
  c.checkpoint.collapse_entropy = 0.0  # nats per token below which a step whose groups carry no
                                    # signal looks collapsed (0 = off)
  c.checkpoint.collapse_reward_drop = 0.0  # a step whose mean reward falls below (1 - this) x
                                    # its running mean looks collapsed (0 = off: a curriculum
                                    # moving to harder bins lowers the reward by design)

  c.parallel = ml_collections.ConfigDict()  # docs/scaling.md
  c.parallel.mesh_shape = (-1, 1, 1)  # devices on (data, fsdp, tensor); one -1 takes the rest
  c.parallel.rollout_devices = 0    # devices that only sample (the last ones of each process),
                                    # a data-parallel rollout mesh apart from the learner's
                                    # mesh_shape over the rest; weights (LoRA: the adapters)
                                    # sent after every update (0 = the learner's devices sample)
  c.parallel.rollout_layout = "learner"  # with rollout_devices = 0, the engine's copy of the
                                    # weights on the learner's devices, made once a step:
                                    # learner (none: under fsdp or tensor the decode loop
                                    # gathers what it reads), replicated, tensor (over
                                    # rollout_tensor devices), or auto (none when the learner
                                    # holds whole weights, else replicated or the smallest
                                    # tensor split whose copy takes <= 1/4 of a device's
                                    # memory); matrices in model.dtype
  c.parallel.rollout_tensor = 2     # devices of the engine's tensor axis (rollout_layout=tensor)
  c.parallel.coordinator_address = ""  # multi-host: host:port of process 0 ("" = env or none)
  c.parallel.num_processes = 1      # 1 = one process (unless the env names a coordinator);
                                    # 0 = let JAX detect the cluster (TPU pod, SLURM, MPI)
  c.parallel.process_id = -1        # this process's id; -1 = from JAX_PROCESS_ID or the cluster
  c.parallel.check_replicated = False  # assert every step: curriculum state equal everywhere
  return c
