"""The workdir's record of what its cached tokenizer and SFT warm start were made with."""

import json
import os

import pytest

from configs import toy
from rl_curriculum.train import warm_start


def test_fingerprint_keeps_what_sft_reads_and_drops_what_only_rl_reads():
  base = warm_start.fingerprint(toy.get_config())
  for section, name, value in (("rl", "seed", 7), ("task", "format_bonus", 0.0),
                               ("model", "lora_merge_every", 3)):
    c = toy.get_config()
    setattr(getattr(c, section), name, value)
    assert warm_start.fingerprint(c) == base, (section, name)
  for section, name, value in (("sft", "steps", 3), ("task", "train_per_bin", 5),
                               ("tokenizer", "vocab_size", 40)):
    c = toy.get_config()
    setattr(getattr(c, section), name, value)
    assert warm_start.fingerprint(c) != base, (section, name)
  assert "format_bonus" not in base["task"]


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
