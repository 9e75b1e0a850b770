"""Curricula: which prompts the policy practises next, as pure `Curriculum(init, select, update)`.

Category level (a distribution over arms, then prompts without replacement within an arm):
  sec, uniform, easy_to_hard, hard_to_easy, linear_pacing, cyclical, mixed_replay, dump,
  alp_teacher, mastering_rate                                   (module `category`)
Prompt level (statistics per prompt, kept in `prompt_stats`):
  vcrl, vade, greso, adarft, pcl, hard_focus                    (one module each)
Post-rollout filters (`filters`) and rollout budgets (`allocation`) have their own small
interfaces. `gym` is a simulated learner on which any curriculum runs in seconds.
"""

from rl_curriculum.curriculum.base import Curriculum, Feedback, PromptPool, Selection
from rl_curriculum.curriculum.category import (alp_teacher, cyclical, dump, easy_to_hard,
                                               hard_to_easy, linear_pacing, mastering_rate,
                                               mixed_replay, product_arms, sec, split_arms,
                                               uniform)
from rl_curriculum.curriculum.adarft import adarft
from rl_curriculum.curriculum.greso import greso
from rl_curriculum.curriculum.hard_focus import hard_focus
from rl_curriculum.curriculum.pcl import pcl
from rl_curriculum.curriculum.vade import vade
from rl_curriculum.curriculum.vcrl import vcrl
