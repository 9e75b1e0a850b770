"""Example batches: shapes and dtypes, determinism in the seed, the defaults of make_batch."""

import jax
import numpy as np

from rl_curriculum.train.learn import examples
from rl_curriculum.train.learn.rl_types import Batch

P, G, TP, T, V = 3, 2, 5, 4, 32


def _arrays(batch):
  return [np.asarray(x) for x in batch]


def test_example_batch_has_the_batch_contract():
  batch = examples.example_batch(P, G, TP, T, V, num_arms=2)
  assert isinstance(batch, Batch)
  shapes = {"prompt_tokens": (P * G, TP), "prompt_mask": (P * G, TP), "tokens": (P * G, T),
            "mask": (P * G, T), "sampler_logprobs": (P * G, T), "prompt_ids": (P,), "arms": (P,),
            "rewards": (P, G), "correct": (P, G), "valid": (P, G), "train_groups": (P,),
            "train_valid": (P,), "truncated": (P, G)}
  assert {k: getattr(batch, k).shape for k in shapes} == shapes
  # A plain rollout has no per-prompt baseline (only the counterfactual estimator sets one), and
  # no version tags (every token sampled by the policy the learn step starts from).
  assert batch.baseline is None and batch.versions is None
  dtypes = {k: str(v.dtype) for k, v in batch._asdict().items() if v is not None}
  assert dtypes == {"prompt_tokens": "int32", "prompt_mask": "bool", "tokens": "int32",
                    "mask": "float32", "sampler_logprobs": "float32", "prompt_ids": "int32",
                    "arms": "int32", "rewards": "float32", "correct": "bool", "valid": "bool",
                    "train_groups": "int32", "train_valid": "bool", "truncated": "bool"}
  prompts = np.asarray(batch.prompt_tokens)
  # A group's rows repeat the prompt the sampler benchmark draws at batch P.
  np.testing.assert_array_equal(prompts, np.repeat(examples.random_prompts(P, TP, V), G, axis=0))
  assert np.all(np.asarray(batch.tokens) >= 3) and np.all(np.asarray(batch.tokens) < V)
  assert set(np.unique(np.asarray(batch.rewards))) <= {0.0, 1.0}
  np.testing.assert_array_equal(np.asarray(batch.correct), np.asarray(batch.rewards) > 0.5)
  np.testing.assert_allclose(np.asarray(batch.sampler_logprobs), -np.log(V), rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(batch.arms), [0, 1, 0])
  assert np.all(np.asarray(batch.mask) == 1) and np.all(np.asarray(batch.valid))
  np.testing.assert_array_equal(np.asarray(batch.train_groups), np.arange(P))
  # Every completion fills its T slots and holds no stop token: the cap cut them all.
  assert np.all(np.asarray(batch.truncated))


def test_example_batch_is_deterministic_in_the_seed():
  first, again = examples.example_batch(P, G, TP, T, V), examples.example_batch(P, G, TP, T, V)
  assert all(np.array_equal(a, b) for a, b in zip(_arrays(first), _arrays(again)))
  other = examples.example_batch(P, G, TP, T, V, seed=1)
  assert not np.array_equal(np.asarray(first.tokens), np.asarray(other.tokens))


def test_example_batch_draws_rewards_then_completions_from_one_generator():
  batch = examples.example_batch(P, G, TP, T, V, seed=7)
  rng = np.random.default_rng(7)
  np.testing.assert_array_equal(np.asarray(batch.rewards), rng.integers(0, 2, (P, G)))
  np.testing.assert_array_equal(np.asarray(batch.tokens), rng.integers(3, V, (P * G, T)))


def test_make_batch_fills_what_is_left_out():
  rewards = np.array([[1.0, 0.0], [0.2, 0.9]], np.float32)
  prompts = np.arange(4 * TP).reshape(4, TP) % V
  tokens = np.arange(4 * T).reshape(4, T) % V
  batch = examples.make_batch(prompts, tokens, rewards)
  np.testing.assert_array_equal(np.asarray(batch.correct), [[True, False], [False, True]])
  np.testing.assert_array_equal(np.asarray(batch.arms), [0, 0])
  np.testing.assert_array_equal(np.asarray(batch.prompt_ids), [0, 1])
  assert np.all(np.asarray(batch.prompt_mask)) and np.all(np.asarray(batch.sampler_logprobs) == 0)
  np.testing.assert_array_equal(np.asarray(batch.train_valid), [True, True])
  kept = examples.make_batch(prompts, tokens, rewards, train_groups=jax.numpy.array([1, 1, 0]),
                             train_valid=np.array([True, False, True]),
                             correct=np.zeros((2, 2), bool), mask=np.zeros((4, T)))
  assert kept.train_groups.dtype == np.int32 and kept.train_valid.shape == (3,)
  assert not np.any(np.asarray(kept.correct)) and not np.any(np.asarray(kept.mask))
  # A completion that fills its row was cut, unless it ends with a stop token (row 1 ends with 7).
  np.testing.assert_array_equal(np.asarray(batch.truncated), [[True, True], [True, True]])
  stopped = examples.make_batch(prompts, tokens, rewards, stop_ids=(7,))
  np.testing.assert_array_equal(np.asarray(stopped.truncated), [[True, False], [True, True]])
  assert not np.any(np.asarray(kept.truncated))
