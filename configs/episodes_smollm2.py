"""SmolLM2-135M-Instruct learns to use a calculator and to play a guessing game: an SFT warm start
on the environments' own solved episodes, then RLOO on multi-turn episodes with SEC over
(environment, level) arms, on a CPU.

  python -m experiments.train --config configs/episodes_smollm2.py --workdir workdirs/episodes
  python -m experiments.studies.seeds --config configs/episodes_smollm2.py --seeds=3 \\
      --workdir=workdirs/episodes_seeds --out=benchmarks/results/episodes_smollm2

Two environments (docs/environments.md): `calculator` (two- and three-digit products, which a
135M model cannot work out in its head, with a `calc` tool whose result comes back as the next
message) and `guess` (a hidden number found from "too low" / "too high" replies). Each episode is
a chat: the policy's turns and the environment's replies framed by the checkpoint's chat
template, token in, token out, on the continuous engine over a paged cache; the replies' tokens
never enter a loss. The warm start imitates each training problem's solved episode (the
calculator: call the tool, then answer with its value; the game: binary search), the replies
given no loss, full fine-tuning of the base; RL then trains LoRA adapters on top of it. Held out,
disjoint by construction (`Task.split_key`): no held-out product has a training problem's
operands, no held-out game hides a number any training game hides; the third level of each
environment is never trained on.

Measured (three RL seeds from one warm start, 2026-12-07; docs/results.md, "Multi-turn tool
use", and benchmarks/results/episodes_smollm2/): held-out calculator products 3.1% -> 100%, 0%
and 15.6% by seed (a seed learns the tool once its rollouts find a rewarded calculator episode:
at step 1, never, at step 16), every solved episode calling the tool; the guessing game at 1-64
0% -> 14.6% [+3.9, +25.2] over the seeds.
"""

from configs import quickstart


def get_config():
  c = quickstart.get_config()
  c.task.name = "calculator+guess"
  c.task.template = "chat"
  c.task.options = {}
  c.task.train_bins = (0, 1, 3, 4)      # calculator l0 l1, guess l0 l1
  c.task.eval_bins = (0, 1, 2, 3, 4, 5)  # and l2 of each, never trained on
  c.task.held_out_fraction = 0.2
  c.task.train_per_bin = 200
  c.task.sft_per_bin = 64
  c.task.eval_per_bin = 32
  # The warm start: 4 steps on solved episodes of the training bins (the replies given no loss),
  # the whole model fine-tuned at a constant rate; RL's LoRA adapters start from it. It is kept
  # short on purpose (benchmarks/episodes_sft_steps.py): held out, 4 steps leave the calculator
  # at 3% (l0) and 0% (l1) with a tool-call rate of 5% (l0), 6 steps already at 100% and 94%;
  # 12 steps (2 of warm-up) solved every calculator level, the untrained l2 included.
  c.sft.steps = 4
  c.sft.batch_size = 8
  c.sft.learning_rate = 2e-5
  c.sft.warmup_steps = 0
  c.sft.save_every = 0
  c.rl.steps = 20
  c.rl.prompts_per_step = 6
  c.rl.group_size = 4
  c.rl.engine = "continuous"
  c.rl.page_size = 16
  c.rl.decode_slots = 24
  c.rl.decode_shrink = 0
  c.rl.max_new_tokens = 128             # an episode's positions: turns and replies
  c.rl.turn_tokens = 24                 # "<tool>calc(835*941-4098)</tool>" is 21
  c.rl.observation_tokens = 48          # a reply and its chat framing (10 ids): the format
                                        # hint after a turn with neither a call nor an answer
                                        # (about 35 ids) fits whole
  c.rl.max_turns = 5                    # calculator 4 and guess 5 / 8 / 11 turns of their own
  c.curriculum.horizon = "fixed"
  c.eval.batch_size = 32
  c.rl.microbatches = 2
  return c
