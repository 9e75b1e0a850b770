"""The curriculum interface: pure `init`, `select`, `update` functions in the optax style.

A curriculum decides which P prompts of a pool of N the policy practises in the next step. It is a
`Curriculum(init, select, update)` of pure, jittable functions over an explicit state pytree:

  state = curriculum.init(pool, key)
  selection, state = curriculum.select(state, key)      # Selection(prompt_ids i32[P], arms i32[P])
  state, metrics = curriculum.update(state, feedback)   # Feedback(prompt_ids, arms, rewards, ...)

Every state is a pytree of arrays (Orbax can save it); `select` is deterministic given the key.
"""

from typing import Any, Callable, NamedTuple

from flax import struct
import jax
import jax.numpy as jnp
import numpy as np

from rl_curriculum.types import Feedback, Selection

__all__ = ["Curriculum", "PromptPool", "Feedback", "Selection"]


@struct.dataclass
class PromptPool:
  """Arrays describing the training pool of N prompts in K categories (arms).

  A pytree whose `num_arms` is static, so pools can be passed through `jax.jit`.
  """
  arms: jax.Array        # i32[N] arm (category) of each prompt, in [0, K)
  difficulty: jax.Array  # f32[N] scalar difficulty when known (else the arm index)
  num_arms: int = struct.field(pytree_node=False)  # K

  @classmethod
  def from_arms(cls, arms, num_arms=None, difficulty=None) -> "PromptPool":
    """Builds a pool from per-prompt arm labels; difficulty defaults to the arm index."""
    arms = np.asarray(arms, np.int32)
    if arms.ndim != 1 or arms.size == 0:
      raise ValueError(f"arms must be a non-empty 1-D array, got shape {arms.shape}")
    k = int(arms.max()) + 1 if num_arms is None else int(num_arms)
    if arms.min() < 0 or arms.max() >= k:
      raise ValueError(f"arm labels must lie in [0, {k}), got [{arms.min()}, {arms.max()}]")
    if difficulty is None:
      difficulty = arms.astype(np.float32)
    difficulty = np.asarray(difficulty, np.float32)
    if difficulty.shape != arms.shape:
      raise ValueError(f"difficulty shape {difficulty.shape} != arms shape {arms.shape}")
    return cls(arms=jnp.asarray(arms), difficulty=jnp.asarray(difficulty), num_arms=k)

  @property
  def size(self) -> int:
    return int(self.arms.shape[0])


InitFn = Callable[[PromptPool, jax.Array], Any]
SelectFn = Callable[[Any, jax.Array], tuple[Selection, Any]]
UpdateFn = Callable[[Any, Feedback], tuple[Any, dict]]


class Curriculum(NamedTuple):
  """A curriculum as three pure functions (see the module docstring)."""
  init: InitFn
  select: SelectFn
  update: UpdateFn
