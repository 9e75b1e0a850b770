"""RL math kernels: advantages, per-token log-probs, policy/value/KL losses, stability pack.

Pure functions of arrays (rewards, log-probs, masks), independent of the model:

  from rl_curriculum.rl import advantages, logprobs, losses, stability
"""

from rl_curriculum.rl import advantages
from rl_curriculum.rl import logprobs
from rl_curriculum.rl import losses
from rl_curriculum.rl import stability

__all__ = ["advantages", "logprobs", "losses", "stability"]
