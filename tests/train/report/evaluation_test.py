"""Tests of rl_curriculum/train/report/evaluation.py: pass@k, grouped generation, per-task accuracy and
skill balance."""

import itertools

import jax
import numpy as np
import pytest

from rl_curriculum.model import transformer
from rl_curriculum.model.config import ModelConfig
from rl_curriculum.tasks.data import TaskPool, left_pad
from rl_curriculum.train.report import evaluation

CONFIG = ModelConfig.tiny(vocab_size=40, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
                          mlp_dim=48, init_std=0.3)
NEVER = CONFIG.vocab_size  # an eos id the model cannot emit: every row runs to max_new_tokens
GEN = dict(max_new_tokens=5, eos_id=NEVER, pad_id=0)


@pytest.fixture(scope="module")
def model():
  return transformer.init_model(CONFIG, seed=0)


def _pool(n=5, seed=0):
  rng = np.random.default_rng(seed)
  prompts = [list(rng.integers(1, CONFIG.vocab_size, size=1 + i % 4)) for i in range(n)]
  tokens, mask = left_pad(prompts, pad_id=0, length=4)
  return TaskPool(problems=tuple(range(n)), arms=np.zeros(n, np.int32),
                  difficulty=np.zeros(n, np.float32), tokens=tokens, mask=mask, num_arms=1)


def _decode(row):
  return " ".join(str(int(t)) for t in row)


@pytest.mark.parametrize("n,c,k", [(5, 0, 1), (5, 2, 1), (5, 2, 3), (6, 3, 3), (4, 4, 2),
                                   (7, 1, 7)])
def test_pass_at_k_is_the_probability_over_all_k_subsets(n, c, k):
  outcomes = [True] * c + [False] * (n - c)
  subsets = list(itertools.combinations(outcomes, k))
  expected = np.mean([any(s) for s in subsets])
  np.testing.assert_allclose(evaluation.pass_at_k(n, c, k), expected, atol=1e-12)


def test_pass_at_k_rejects_k_above_samples():
  with pytest.raises(ValueError, match="k=3 > samples=2"):
    evaluation.pass_at_k(2, 1, 3)


@pytest.mark.parametrize("batch_size", [2, 3, 8])
def test_grouped_greedy_texts_repeat_each_prompts_text(model, batch_size):
  # Prompt order, the padded last batch and the per-prompt runs of `group` texts line up.
  graphdef, params = model
  pool = _pool()
  single = evaluation.generate_texts(graphdef, params, pool, _decode, batch_size=4, **GEN)
  grouped = evaluation.generate_texts(graphdef, params, pool, _decode, batch_size=batch_size,
                                      group=3, **GEN)
  assert len(set(single)) > 1  # distinct prompts give distinct texts: the check can fail
  assert grouped == [t for t in single for _ in range(3)]


def test_sampled_pass_at_k_scores_each_sample_against_its_own_problem(model):
  graphdef, params = model
  pool = _pool()
  greedy = evaluation.generate_texts(graphdef, params, pool, _decode, batch_size=4, **GEN)
  seen = []

  class Task:
    """Correct when the text is its problem's greedy text and the problem id is even."""

    def score_batch(self, problems, texts):
      seen.extend(problems)
      correct = np.array([t == greedy[p] and p % 2 == 0 for p, t in zip(problems, texts)])
      return correct.astype(np.float32), correct, None

  kw = dict(k=2, samples=4, batch_size=8, key=jax.random.PRNGKey(1), **GEN)
  # A near-zero temperature samples the argmax: every sample of an even problem is correct.
  cold = evaluation.sampled_pass_at_k(graphdef, params, pool, Task(), _decode,
                                      temperature=1e-6, **kw)
  assert seen == [p for p in range(5) for _ in range(4)]
  np.testing.assert_allclose(cold, 3 / 5, atol=1e-12)
  # At temperature 1 the samples of this random-weight model differ from greedy: pass@2 drops.
  warm = evaluation.sampled_pass_at_k(graphdef, params, pool, Task(), _decode, temperature=1.0,
                                      **kw)
  assert 0.0 <= warm < cold


def test_task_accuracy_weights_the_trained_bins_by_their_problems():
  accuracy = {"countdown/n3": 0.5, "countdown/n4": 0.2, "countdown/n5": 0.0,
              "zebra/2x2": 0.9, "zebra/4x4": 0.1, "arc1d/move_10": 0.4}
  sizes = {"countdown/n3": 30, "countdown/n4": 10, "countdown/n5": 50, "zebra/2x2": 20,
           "zebra/4x4": 20, "arc1d/move_10": 8}
  trained = ["countdown/n3", "countdown/n4", "zebra/2x2"]
  out = evaluation.task_accuracy(accuracy, sizes, trained)
  # countdown: (0.5 * 30 + 0.2 * 10) / 40; n5 is not trained. zebra: 2x2 alone. arc1d: no trained
  # bin, so all its evaluated bins.
  assert out.keys() == {"countdown", "zebra", "arc1d"}
  np.testing.assert_allclose(out["countdown"], 17 / 40, rtol=1e-12)
  assert out["zebra"] == 0.9 and out["arc1d"] == 0.4
  assert evaluation.task_accuracy({"add": 1.0}, {"add": 5}, ["add"]) == {}  # no task names


def test_skill_balance_is_the_smallest_gain_and_the_spread():
  before = {"countdown": 0.2, "zebra": 0.5, "arc1d": 0.1}
  now = {"countdown": 0.5, "zebra": 0.45, "arc1d": 0.3}
  balance = evaluation.skill_balance(now, before)
  np.testing.assert_allclose(balance["min_gain"], -0.05, atol=1e-12)
  np.testing.assert_allclose(balance["spread"], 0.2, atol=1e-12)
