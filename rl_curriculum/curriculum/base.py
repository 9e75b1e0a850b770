"""The curriculum interface: pure `init`, `select`, `update` functions in the optax style.

A curriculum decides which P prompts of a pool of N the policy practises in the next step. It is a
`Curriculum(init, select, update)` of pure, jittable functions over an explicit state pytree:

  state = curriculum.init(pool, key)
  selection, state = curriculum.select(state, key)      # Selection(prompt_ids i32[P], arms i32[P])
  state, metrics = curriculum.update(state, feedback)   # Feedback(prompt_ids, arms, rewards, ...)

Every state is a pytree of arrays (Orbax can save it); `select` is deterministic given the key.

Every constructor has one signature, `name(pool, *, batch_size, **options)`: `pool` is the
`PromptPool` the curriculum will select from, or just its number of arms K where no pool exists yet
(a config check), and `batch_size` is P.
"""

from typing import Any, Callable, NamedTuple, Optional

from flax import struct
import jax
import jax.numpy as jnp
import numpy as np

from rl_curriculum.types import Feedback, Selection

__all__ = ["Curriculum", "PromptPool", "Feedback", "Selection"]


@struct.dataclass
class PromptPool:
  """Arrays describing the training pool of N prompts in K categories (arms).

  A pytree whose `num_arms` is static, so pools can be passed through `jax.jit`. `features` is
  optional: per-prompt feature vectors for curricula that score prompts with a model of their own
  (PCL's value head); None for every other curriculum.
  """
  arms: jax.Array        # i32[N] arm (category) of each prompt, in [0, K)
  difficulty: jax.Array  # f32[N] scalar difficulty when known (else the arm index)
  num_arms: int = struct.field(pytree_node=False)  # K
  features: Optional[jax.Array] = None  # f32[N, D] per-prompt features, or None

  @classmethod
  def from_arms(cls, arms, num_arms=None, difficulty=None, features=None) -> "PromptPool":
    """Builds a pool from per-prompt arm labels; difficulty defaults to the arm index.

    Raises:
      ValueError: arms not a non-empty 1-D array, labels outside [0, num_arms), or difficulty /
        features whose leading size is not N.
    """
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
    pool = cls(arms=jnp.asarray(arms), difficulty=jnp.asarray(difficulty), num_arms=k)
    return pool if features is None else pool.with_features(features)

  def with_features(self, features) -> "PromptPool":
    """This pool with per-prompt features f32[N, D] (D >= 1), one row per prompt.

    Raises:
      ValueError: features that are not a 2-D array of N rows and at least one column.
    """
    feats = jnp.asarray(features, jnp.float32)
    if feats.ndim != 2 or feats.shape[0] != self.size or feats.shape[1] < 1:
      raise ValueError(f"features must be f32[N, D] with N = {self.size} rows (one per prompt) "
                       f"and D >= 1, got shape {feats.shape}")
    return self.replace(features=feats)

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
