"""Every objective family on rows with observations inside them (rl_curriculum/train/learn/view.py
and rl_step.score_groups on an episode's mask).

An episode's row holds a turn, an observation (mask 0), a second turn, and an observation or
padding after it. Under RLOO, GRPO, Dr. GRPO and REINFORCE++ each drawn token of both turns must
carry its episode's group advantage and no observation position any; under PPO with a critic the
outcome reward on the last turn must reach the first turn through GAE, and each turn's reward
count from the turn it follows; with turn credit, turn k's tokens carry the group advantage of
its return to go.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from rl_curriculum.rl import advantages as adv_lib
from rl_curriculum.rl import stability
from rl_curriculum.train.learn import examples, rl_step
from rl_curriculum.train.learn import view as view_lib
from rl_curriculum.train.state import init_value_head
import test_util

P, G, TP, V = test_util.P, test_util.G, test_util.TP, test_util.V
T = 10
WIDTH = 32  # test_util.tiny_model's d_model: the value head's input
TURN_1, OBSERVATION, TURN_2, AFTER = slice(0, 3), slice(3, 5), slice(5, 8), slice(8, 10)
# Each turn's reward: the outcome on the second turn, and 0.25 after some first turns.
TURN_REWARDS = np.stack([np.where(np.arange(G)[None] % 2 == 0, 0.25, 0.0) * np.ones((P, 1)),
                         test_util.LEARN_REWARDS], axis=-1).astype(np.float32)


def _mask() -> np.ndarray:
  mask = np.zeros((P * G, T), np.float32)
  mask[:, TURN_1] = 1.0
  mask[:, TURN_2] = 1.0
  return mask


@pytest.fixture(scope="module")
def model():
  return test_util.tiny_model()


def _view(model, algorithm, **fields):
  graphdef, params = model
  prompts = jnp.repeat(jnp.arange(P * TP).reshape(P, TP) % (V - 4) + 4, G, axis=0)
  tokens = (np.arange(P * G * T).reshape(P * G, T) * 7) % (V - 4) + 4
  batch = examples.make_batch(prompts, tokens, TURN_REWARDS.sum(-1), mask=_mask(), num_arms=2,
                              turn_rewards=TURN_REWARDS)
  config = test_util.learn_config(algorithm=algorithm, minibatches=1, max_tokens=T, **fields)
  scores = rl_step.score_groups(batch, stability.whitening_init(), config)
  value = init_value_head(WIDTH) if algorithm == "ppo" else None
  view = view_lib.train_view(batch, scores, params, graphdef=graphdef, ref_params=None,
                             config=config, use_lora=False, value=value)
  return batch, scores, view


@pytest.mark.parametrize("algorithm", ["rloo", "grpo", "dr_grpo", "reinforce_pp"])
def test_a_group_estimator_gives_every_turn_its_episodes_advantage(model, algorithm):
  _, scores, view = _view(model, algorithm)
  adv = np.asarray(view.advantages)
  group = np.asarray(scores.advantages).reshape(-1)
  assert np.count_nonzero(group) >= 4  # groups with signal exist
  for turn in (TURN_1, TURN_2):
    np.testing.assert_array_equal(adv[:, turn], np.repeat(group[:, None], 3, axis=1))
  np.testing.assert_array_equal(adv[:, OBSERVATION], 0.0)
  np.testing.assert_array_equal(adv[:, AFTER], 0.0)


def test_ppo_carries_each_turns_reward_back_through_the_observations(model):
  """gamma = lambda = 1 and a critic at 0: every drawn token's return is the sum of the rewards of
  its turn and the turns after it (the outcome reaches the first turn); observation positions
  carry no return and no advantage."""
  _, _, view = _view(model, "ppo", gamma=1.0, lam=1.0)
  returns, adv = np.asarray(view.returns), np.asarray(view.advantages)
  to_go = TURN_REWARDS.reshape(P * G, 2)[:, ::-1].cumsum(axis=1)[:, ::-1]
  np.testing.assert_allclose(returns[:, TURN_1], np.repeat(to_go[:, :1], 3, axis=1),
                             **test_util.TOL)
  np.testing.assert_allclose(returns[:, TURN_2], np.repeat(to_go[:, 1:], 3, axis=1),
                             **test_util.TOL)
  for positions in (OBSERVATION, AFTER):
    np.testing.assert_array_equal(returns[:, positions], 0.0)
    np.testing.assert_array_equal(adv[:, positions], 0.0)
  # Whitened over the batch's tokens, the advantages still tell the rows apart on both turns.
  for turn in (TURN_1, TURN_2):
    assert np.unique(adv[:, turn].round(5)).size > 1


@pytest.mark.parametrize("algorithm", ["rloo", "dr_grpo"])
def test_turn_credit_gives_each_turn_its_return_to_gos_advantage(model, algorithm):
  _, _, view = _view(model, algorithm, credit="turn", turn_discount=1.0)
  adv = np.asarray(view.advantages)
  to_go = TURN_REWARDS[..., ::-1].cumsum(axis=-1)[..., ::-1]
  valid = jnp.ones((P, G), bool)
  for k, turn in enumerate((TURN_1, TURN_2)):
    want = np.asarray(adv_lib.group_advantages(jnp.asarray(to_go[..., k]), valid, algorithm))
    np.testing.assert_allclose(adv[:, turn], np.repeat(want.reshape(-1, 1), 3, axis=1),
                               **test_util.TOL)
  np.testing.assert_array_equal(adv[:, OBSERVATION], 0.0)
  np.testing.assert_array_equal(adv[:, AFTER], 0.0)
  # With discount 1 the first turn's return to go is the episode's return: its advantage is the
  # episode's; the second turn's leaves out the first turns' rewards, which differ by row.
  _, scores, _ = _view(model, algorithm)
  episode = np.asarray(scores.advantages).reshape(-1)
  np.testing.assert_allclose(adv[:, 0], episode, **test_util.TOL)
  assert not np.allclose(adv[:, 5], episode)


def test_a_length_penalty_counts_positions_like_its_cap(model):
  """DAPO's penalty with L_max = T positions: an episode's length is the positions it used,
  turns and observations alike (8 here), not its drawn tokens (6)."""
  batch, _, _ = _view(model, "rloo")
  config = test_util.learn_config(overlong="penalty", overlong_cache=4, max_tokens=T)
  penalty = np.asarray(rl_step.batch_overlong_penalty(batch, config))
  np.testing.assert_allclose(penalty, -2 / 4, **test_util.TOL)  # (T - 4 - 8) / 4
