"""Tests of multi-turn episodes on the host (rl_curriculum/train/rollout/episodes.py).

A tiny random model plays a scripted environment (it ends a row's episode after the number of
turns its problem says, paying 0.25 a turn) through the continuous engine, with a small ChatML
tokenizer made here: each observation's ids are written where the row's turn ended, framed as one
more chat message, with mask 0; the returns sum the turns' rewards; the turn limit, the per-turn
token limit and the episode's positions bound every row; an episode's staleness is that of its
oldest token.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from rl_curriculum.environments import base as env_base
from rl_curriculum.model import transformer
from rl_curriculum.model.hf_tokenizer import HFTokenizer
from rl_curriculum.sampling import continuous
from rl_curriculum.sampling import inflight
from rl_curriculum.sampling import turns
from rl_curriculum.tasks.base import Problem
from rl_curriculum.train.rollout import episodes
import test_util

V, R, N, TP = 320, 6, 40, 6
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
EOS = 2
LIMITS = episodes.Limits(max_turns=3, turn_tokens=5, observation_tokens=12, max_new_tokens=N)


class Scripted(env_base.Environment):
  """Ends an episode after problem.meta["turns"] turns, paying 0.25 a turn; its observation names
  the turn."""
  name = "scripted"
  bin_names = ("only",)

  def _make(self, seed, difficulty):
    return Problem(task=self.name, difficulty=difficulty, prompt=f"go {seed}\n",
                   question=f"go {seed}", answer="", target="", seed=seed,
                   meta={"turns": 1 + seed % 4})

  def reset(self, problem, seed=0):
    return {"turn": 0}

  def step(self, problem, state, text):
    turn = state["turn"] + 1
    done = turn >= problem.meta["turns"]
    return {"turn": turn}, env_base.Step(observation="" if done else f"turn {turn} seen",
                                         reward=0.25, done=done, tool_call=False,
                                         well_formed=True, correct=done)


@pytest.fixture(scope="module")
def tokenizer():
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(["user assistant turn seen go 0 1 2 3 4 5"] * 10, trainers.BpeTrainer(
      vocab_size=V, special_tokens=SPECIALS,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
  return HFTokenizer(tok, eos_id=EOS, bos_id=1)


@pytest.fixture(scope="module")
def model():
  return transformer.init_model(test_util.engine_model_config(False, vocab=V), seed=0)


def test_an_observation_is_framed_as_one_more_chat_message(tokenizer):
  assert episodes.observation_framing(tokenizer, "chat") == (
      "\n<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n")
  assert episodes.observation_framing(tokenizer, "plain") == ("\n", "\n")
  ids = episodes.encode_observation(tokenizer, ("<|im_start|>", "<|im_end|>"), "turn " * 20, 6)
  assert len(ids) == 6 and ids[0] == 1 and ids[-1] == EOS  # the text cut, the framing whole


def _play(model, tokenizer, versions=False):
  graphdef, params = model
  task = Scripted(template="chat")
  problems = [task.generate(seed, 0) for seed in range(R)]
  rng = np.random.default_rng(0)
  prompts = jnp.asarray(rng.integers(3, V, (R, TP)), jnp.int32)
  draw = dict(stop_ids=(EOS,), pad_id=0)
  state = inflight.init(graphdef, params, jax.random.PRNGKey(0), rows=R, generations=1,
                        prompt_len=TP, slots=2, max_new_tokens=N, pad_id=0, page_size=4,
                        kv_pages=turns.episode_pages(R, N, 4))
  state = inflight.admit(graphdef, params, turns.episodic(state), prompts,
                         jnp.ones((R, TP), bool), jax.random.PRNGKey(1), jnp.int32(0),
                         jnp.float32(1.0), jnp.int32(1), None,
                         jnp.full((R,), LIMITS.turn_tokens, jnp.int32), max_new_tokens=N,
                         **draw)
  calls = []

  def run(s):
    calls.append(len(calls))
    version = jnp.int32(len(calls) if versions else 1)
    return continuous.run(graphdef, params, s, jnp.float32(1.0), version, **draw)

  framing = episodes.observation_framing(tokenizer, "chat")
  state, played = episodes.play(state, run=run, problems=problems, task=task,
                                seeds=list(range(R)), tokenizer=tokenizer, framing=framing,
                                limits=LIMITS)
  rows = jax.device_get(inflight.harvest(state, jnp.int32(0)))
  return problems, played, rows, framing


def test_each_row_plays_its_turns_with_its_observations_masked(model, tokenizer):
  problems, played, rows, framing = _play(model, tokenizer)
  want_turns = np.array([min(p.meta["turns"], LIMITS.max_turns) for p in problems])
  np.testing.assert_array_equal(played.turns, want_turns)
  np.testing.assert_allclose(played.rewards, 0.25 * want_turns)
  np.testing.assert_array_equal(played.correct, [p.meta["turns"] <= 3 for p in problems])
  np.testing.assert_array_equal(played.cut, [p.meta["turns"] > 3 for p in problems])
  for r, problem in enumerate(problems):
    drawn = np.flatnonzero(rows.mask[r])
    # Turns are runs of drawn positions; between them lie the observations, mask 0.
    runs = np.split(drawn, np.flatnonzero(np.diff(drawn) > 1) + 1)
    assert len(runs) == want_turns[r]
    for t, turn in enumerate(runs):
      assert len(turn) <= LIMITS.turn_tokens
      if t + 1 < len(runs):
        ids = episodes.encode_observation(tokenizer, framing, f"turn {t + 1} seen",
                                          LIMITS.observation_tokens)
        gap = rows.tokens[r, turn[-1] + 1:runs[t + 1][0]]
        np.testing.assert_array_equal(gap, ids)
        np.testing.assert_array_equal(rows.mask[r, turn[-1] + 1:runs[t + 1][0]], 0)
  stats = episodes.episode_stats(played, np.ones(R, bool))
  assert stats["episode/turns"] == pytest.approx(want_turns.mean())
  assert stats["episode/success"] == pytest.approx(np.mean(want_turns == [
      p.meta["turns"] for p in problems]))


def test_an_episodes_staleness_is_its_oldest_tokens(model, tokenizer):
  """Each round of turns decodes with the next version (1, 2, 3): an episode of three turns has
  tokens of versions 1 to 3 and is as stale as its first turn; observation positions (version 0,
  never drawn) do not count."""
  problems, played, rows, _ = _play(model, tokenizer, versions=True)
  for r in range(R):
    drawn = rows.mask[r] > 0
    assert rows.versions[r][drawn].min() == 1
    assert rows.versions[r][drawn].max() == played.turns[r]
    assert (rows.versions[r][~drawn] == 0).all()
  np.testing.assert_array_equal(played.oldest, 1)
  np.testing.assert_array_equal(played.staleness(5), 4)
