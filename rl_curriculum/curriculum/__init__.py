"""Curricula: which prompts the policy practises next, as pure `Curriculum(init, select, update)`.

Every constructor is `name(pool, *, batch_size, **options)`, with `pool` the `PromptPool` (or just
its number of arms where no pool exists yet).

Category level (a distribution over arms, then prompts without replacement within an arm; the
shared builder and per-arm statistics are in `arms`):
  sec                                                           (module `sec`)
  uniform                                                       (module `uniform`)
  easy_to_hard, hard_to_easy, linear_pacing, cyclical, mixed_replay   (module `schedules`)
  dump                                                          (module `dump`)
  alp_teacher, mastering_rate                                   (module `teachers`)
  learnability                                                  (module `learnability`)
Prompt level (statistics per prompt, kept in `prompt_stats`):
  vcrl, vade, greso, adarft, pcl, hard_focus                    (one module each)
Post-rollout filters (`filters`) and rollout budgets (`allocation`) have their own small
interfaces. `gym` is a simulated learner on which any curriculum runs in seconds.
"""

from rl_curriculum.curriculum.base import Curriculum, Feedback, PromptPool, Selection
from rl_curriculum.curriculum.dump import dump
from rl_curriculum.curriculum.learnability import learnability
from rl_curriculum.curriculum.schedules import (cyclical, easy_to_hard, hard_to_easy,
                                                linear_pacing, mixed_replay)
from rl_curriculum.curriculum.sec import sec
from rl_curriculum.curriculum.teachers import alp_teacher, mastering_rate
from rl_curriculum.curriculum.uniform import uniform
from rl_curriculum.curriculum.adarft import adarft
from rl_curriculum.curriculum.greso import greso
from rl_curriculum.curriculum.hard_focus import hard_focus
from rl_curriculum.curriculum.pcl import pcl
from rl_curriculum.curriculum.vade import vade
from rl_curriculum.curriculum.vcrl import vcrl

__all__ = ["Curriculum", "Feedback", "PromptPool", "Selection",
           "sec", "uniform", "easy_to_hard", "hard_to_easy",
           "linear_pacing", "cyclical", "mixed_replay", "dump", "alp_teacher", "mastering_rate",
           "learnability", "vcrl", "vade", "greso", "adarft", "pcl", "hard_focus"]
