"""An observation token of a multi-turn episode never contributes to the loss, the KL or the
entropy (rl_curriculum/train/learn/objective.py with an episode's mask).

An episode's row holds the policy's turns and the environment's observations; the engine gives the
observations mask 0 as it writes them (tests/sampling/turns_test.py). Here the learn objective,
with the KL against a reference and the entropy bonus both on, must not read an observation
position's own terms: setting every per-token input there (old, sampler and reference log-probs,
advantages) to other values, or another id at observation positions that nothing trained follows,
leaves the loss, its metrics and every gradient exactly as they were.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_curriculum.rl import stability
from rl_curriculum.train.learn import examples, objective, rl_step
from rl_curriculum.train.learn import view as view_lib
import test_util

P, G, TP, V = test_util.P, test_util.G, test_util.TP, test_util.V
T = 8  # positions of an episode: turn, observation, turn, observation


def _episode_mask() -> np.ndarray:
  """f32[P G, T]: a turn, an observation (mask 0) in the middle, another turn, and an observation
  in the last two positions (an episode cut after a reply)."""
  mask = np.ones((P * G, T), np.float32)
  mask[:, 2:4] = 0.0
  mask[:, T - 2:] = 0.0
  return mask


@pytest.fixture(scope="module")
def setup():
  """(the episode batch's view, loss(view) -> (loss, metrics, gradients)): one jitted program
  for every test of this module."""
  graphdef, params = test_util.tiny_model()
  ref = jax.tree.map(lambda x: x * 1.1, params)  # another policy: the KL is not zero
  key = jax.random.PRNGKey(1)
  prompts = jnp.repeat(jax.random.randint(key, (P, TP), 4, V), G, axis=0)
  tokens = jax.random.randint(jax.random.fold_in(key, 1), (P * G, T), 4, V)
  batch = examples.make_batch(prompts, tokens, test_util.LEARN_REWARDS.copy(),
                              mask=_episode_mask(), num_arms=2)
  config = test_util.learn_config(minibatches=2, kl_coef=0.1, entropy_coef=0.05, max_tokens=T)
  scores = rl_step.score_groups(batch, stability.whitening_init(), config)
  view = view_lib.train_view(batch, scores, params, graphdef=graphdef, ref_params=ref,
                             config=config, use_lora=False, value=None)

  def objective_of(p, v):
    out, metrics = objective.policy_objective(p, v, graphdef=graphdef, frozen=None, group=G,
                                              config=config)
    return out, {k: x for k, x in metrics.items() if k != "logp_old"}

  value_and_grad = jax.jit(jax.value_and_grad(objective_of, has_aux=True))

  def loss(v):
    (value, metrics), grads = value_and_grad(params, v)
    return jax.device_get((value, metrics, grads))
  return view, loss


def _assert_same(got, want):
  np.testing.assert_array_equal(got[0], want[0])
  for name in want[1]:
    np.testing.assert_array_equal(got[1][name], want[1][name], err_msg=name)
  for a, b in zip(jax.tree.leaves(got[2]), jax.tree.leaves(want[2]), strict=True):
    np.testing.assert_array_equal(a, b)


def test_the_terms_of_observation_positions_are_never_read(setup):
  view, loss = setup
  want = loss(view)
  assert float(want[1]["kl"]) > 0 and float(want[1]["entropy"]) > 0
  observed = jnp.asarray(_episode_mask() == 0)
  other = lambda x: jnp.where(observed, x - 7.0, x)
  changed = view._replace(sampler_logprobs=other(view.sampler_logprobs),
                          logp_old=other(view.logp_old), logp_ref=other(view.logp_ref),
                          advantages=jnp.where(observed, 5.0, view.advantages))
  _assert_same(loss(changed), want)


def test_an_observation_that_nothing_trained_follows_leaves_loss_kl_entropy_and_gradients(setup):
  view, loss = setup
  want = loss(view)
  tokens = np.asarray(view.tokens).copy()
  tokens[:, T - 2:] = (tokens[:, T - 2:] + 1 - 4) % (V - 4) + 4  # other ids, still >= 4
  changed = view._replace(tokens=jnp.asarray(tokens))
  _assert_same(loss(changed), want)
  # The middle observation's ids do matter: the policy's later turn reads them.
  tokens = np.asarray(view.tokens).copy()
  tokens[:, 2:4] = (tokens[:, 2:4] + 1 - 4) % (V - 4) + 4
  moved = loss(view._replace(tokens=jnp.asarray(tokens)))
  assert float(moved[1]["kl"]) != float(want[1]["kl"])
  assert any(not np.array_equal(a, b)
             for a, b in zip(jax.tree.leaves(moved[2]), jax.tree.leaves(want[2])))
