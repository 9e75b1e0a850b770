"""Signs that a policy collapsed, read off one step's metrics on the host.

A collapsed policy is one that training cannot bring back: its updates are accepted (they are
finite and small in KL, so the learn step's guards pass them) yet nothing is learned any more.
The signs, each of one step:

  uniform     entropy >= 0.95 ln V per token after a healthy step below that: the policy became
              one that says nothing (V the tokenizer's vocabulary; an absurd learning rate ends
              here, with every group all wrong). A model that starts so (untrained) is not one
              that collapsed.
  no gradient groups with an advantage, an optimizer step taken, and a gradient norm of exactly
              0: the loss no longer reaches the weights
  no entropy  entropy below `checkpoint.collapse_entropy` nats per token while no group has an
              advantage (every completion of a prompt alike): nothing left to compare (0 = off)
  reward cliff  the batch's mean reward below (1 - `checkpoint.collapse_reward_drop`) times its
              running mean over the healthy steps before (0 = off: a curriculum that moves to
              harder problems lowers the reward by design)

`recovery` acts on `checkpoint.collapse_after` such steps in a row (0 = off): it rolls back to the
newest healthy checkpoint from before the first of them, or stops the run
(`checkpoint.on_collapse`), with the reason in the log.
"""

import math
from typing import Mapping, Optional

__all__ = ["UNIFORM_FRACTION", "REWARD_DECAY", "reason", "reward_mean_after"]

UNIFORM_FRACTION = 0.95   # of ln V: an entropy this high is a uniform policy
REWARD_DECAY = 0.9        # the running mean of the reward: r <- 0.9 r + 0.1 reward_mean


def reason(metrics: Mapping, *, vocab_size: int, min_entropy: float, reward_drop: float,
           reward_mean: Optional[float], entropy_min: Optional[float]) -> Optional[str]:
  """Why step `metrics` (the learn step's, with "entropy", "grad_norm", "nonzero_adv_frac",
  "steps_taken", "reward_mean") looks collapsed, in a few words; None when it does not.
  `reward_mean` is the running mean of the reward over the healthy steps so far, `entropy_min`
  their lowest entropy (None: no healthy step yet)."""
  if float(metrics.get("steps_taken", 0.0)) <= 0:
    return None  # no optimizer step ran: nothing was measured
  entropy = float(metrics["entropy"])
  uniform = UNIFORM_FRACTION * math.log(vocab_size)
  if entropy >= uniform and entropy_min is not None and entropy_min < uniform:
    return f"entropy {entropy:.3f} nats at ln V = {math.log(vocab_size):.3f} (a uniform policy)"
  signal = float(metrics.get("nonzero_adv_frac", 0.0)) > 0
  if signal and float(metrics["grad_norm"]) == 0.0:
    return "gradient norm 0 although groups have an advantage"
  if min_entropy > 0 and entropy < min_entropy and not signal:
    return f"entropy {entropy:.2e} nats below {min_entropy:g} with no group signal"
  reward = float(metrics["reward_mean"])
  if reward_drop > 0 and reward_mean is not None and reward_mean > 0 and (
      reward < (1.0 - reward_drop) * reward_mean):
    return (f"mean reward {reward:.3f} below {1.0 - reward_drop:.2f} x its running mean "
            f"{reward_mean:.3f}")
  return None


def reward_mean_after(reward_mean: Optional[float], metrics: Mapping) -> float:
  """The running mean of the reward after a healthy step (`REWARD_DECAY`)."""
  reward = float(metrics["reward_mean"])
  return reward if reward_mean is None else REWARD_DECAY * reward_mean + (1 - REWARD_DECAY) * reward
