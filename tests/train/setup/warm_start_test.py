"""The workdir's record of what its cached tokenizer and SFT warm start were made with, and how
the warm start is read back."""

import json
import os
from unittest import mock

import jax
import numpy as np
import pytest

from configs import toy, toy_episodes
from rl_curriculum.model import transformer
from rl_curriculum.train.setup import prepare, sft, warm_start
import test_util


def test_fingerprint_keeps_what_sft_reads_and_drops_what_only_rl_reads():
  base = warm_start.fingerprint(toy.get_config())
  for section, name, value in (("rl", "seed", 7), ("task", "format_bonus", 0.0),
                               ("model", "lora_merge_every", 3), ("sft", "save_every", 1)):
    c = toy.get_config()
    setattr(getattr(c, section), name, value)
    assert warm_start.fingerprint(c) == base, (section, name)
  for section, name, value in (("sft", "steps", 3), ("task", "train_per_bin", 5),
                               ("tokenizer", "vocab_size", 40)):
    c = toy.get_config()
    setattr(getattr(c, section), name, value)
    assert warm_start.fingerprint(c) != base, (section, name)
  assert "format_bonus" not in base["task"]
  # The replies' cap shapes an environment's solved episodes, not a single-turn target.
  c = toy.get_config()
  c.rl.observation_tokens = 8
  assert warm_start.fingerprint(c) == base
  episodes = toy_episodes.get_config()
  other = toy_episodes.get_config()
  other.rl.observation_tokens = 24
  assert warm_start.fingerprint(other) != warm_start.fingerprint(episodes)


def test_check_workdir_records_accepts_and_refuses(tmp_path):
  c = toy.get_config()
  warm_start.check_workdir(c, str(tmp_path))
  path = tmp_path / "warm_start.json"
  with open(path) as f:
    assert json.load(f) == json.loads(json.dumps(warm_start.fingerprint(c)))
  c.task.format_bonus = 0.0  # RL-only: the same warm start serves
  warm_start.check_workdir(c, str(tmp_path))
  c.sft.steps += 1
  with pytest.raises(ValueError, match="made with other seed/task/model/tokenizer/sft settings"):
    warm_start.check_workdir(c, str(tmp_path))


def test_check_workdir_reads_a_record_that_still_holds_the_format_bonus(tmp_path):
  c = toy.get_config()
  recorded = json.loads(json.dumps(warm_start.fingerprint(c)))
  recorded["task"]["format_bonus"] = 0.1  # as workdirs recorded it before
  with open(os.path.join(tmp_path, "warm_start.json"), "w") as f:
    json.dump(recorded, f)
  c.task.format_bonus = 0.0
  warm_start.check_workdir(c, str(tmp_path))  # accepted: SFT never saw the bonus
  c.seed += 1
  with pytest.raises(ValueError, match="made with other"):
    warm_start.check_workdir(c, str(tmp_path))


def test_a_saved_warm_start_is_read_into_shapes_and_a_damaged_one_trained_again(tmp_path):
  """A workdir holding a warm start initialises no model: the saved values are read into the
  model's shapes (`transformer.abstract_model`). A damaged one is set aside and SFT runs again
  from the seeded initialisation, to the same values (SFT is deterministic)."""
  config = toy.get_config()
  workdir = str(tmp_path / "run")
  test_util.copy_warm_start(test_util.shared_warm_start(config), workdir)
  initialised, init_model, lines = [], transformer.init_model, []
  with mock.patch.object(transformer, "init_model",
                         lambda *a, **k: initialised.append(a) or init_model(*a, **k)):
    saved = prepare.prepare(config, workdir, log=lambda _: None)
    assert not initialised
    [step] = [d for d in os.listdir(os.path.join(workdir, warm_start.SFT_DIR)) if d.isdigit()]
    test_util.flip_bytes(os.path.join(workdir, warm_start.SFT_DIR, step))
    again = prepare.prepare(config, workdir, log=lines.append)
  assert len(initialised) == 1
  assert any("damaged" in line for line in lines)
  assert os.path.isdir(os.path.join(workdir, warm_start.SFT_DIR + ".damaged", step))
  for x, y in zip(jax.tree.leaves(saved.model.trainable), jax.tree.leaves(again.model.trainable),
                  strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_killed_warm_start_resumes_from_its_progress_to_the_same_values(tmp_path):
  """SFT saves its progress every `sft.save_every` steps; a run killed part-way resumes from the
  newest save and ends with the uninterrupted warm start's values, bit for bit, and the progress
  folder is gone once the warm start is saved."""
  config = toy.get_config()  # 10 SFT steps
  config.sft.save_every = 4
  reference = prepare.prepare(config, test_util.shared_warm_start(config), log=lambda _: None)
  workdir, step, calls, lines = str(tmp_path / "run"), sft.sft_step, [], []

  def killed_at_seventh(*args, **kwargs):
    calls.append(1)
    if len(calls) == 7:
      raise KeyboardInterrupt("killed")
    return step(*args, **kwargs)

  with mock.patch.object(sft, "sft_step", killed_at_seventh), pytest.raises(KeyboardInterrupt):
    prepare.prepare(config, workdir, log=lambda _: None)
  assert sorted(os.listdir(os.path.join(workdir, warm_start.SFT_PROGRESS_DIR))) == ["4"]
  assert not warm_start.has_sft(workdir)
  calls.clear()
  with mock.patch.object(sft, "sft_step", lambda *a, **k: calls.append(1) or step(*a, **k)):
    resumed = prepare.prepare(config, workdir, log=lines.append)
  assert len(calls) == 6  # steps 5-10
  assert any("SFT resumed after step 4 of 10" in line for line in lines)
  assert not os.path.exists(os.path.join(workdir, warm_start.SFT_PROGRESS_DIR))
  for x, y in zip(jax.tree.leaves(reference.model.trainable),
                  jax.tree.leaves(resumed.model.trainable), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
