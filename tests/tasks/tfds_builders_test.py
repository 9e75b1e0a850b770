"""Tests for rl_curriculum/tasks/tfds_builders.py: prepare into a tmp dir, read back, no TF."""

import sys

import grain
import pytest
import tensorflow_datasets as tfds

from rl_curriculum.tasks import get_task, tfds_builders as tb
from rl_curriculum.tasks.base import Problem


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  data_dir = str(tmp_path_factory.mktemp("tfds"))
  configs = {name: tb.ProceduralConfig.make(name, train_per_bin=4, test_per_bin=2, seed=7)
             for name in tb.PROCEDURAL_TASKS}
  for config in configs.values():
    tb.ProceduralTasks(config=config, data_dir=data_dir).download_and_prepare()
  return data_dir, configs


@pytest.mark.parametrize("name", tb.PROCEDURAL_TASKS)
def test_splits_equal_direct_generation(prepared, name):
  data_dir, configs = prepared
  task = get_task(name)
  for split, per_bin, bins in (("train", 4, task.train_bins),
                               ("test", 2, range(task.num_difficulties))):
    problems = tb.load_split(name, split, data_dir=data_dir, config=configs[name])
    expected = [task.generate(tb.split_seed(7, split, j), b) for b in bins for j in range(per_bin)]
    assert problems == expected
    for p in problems:
      assert task.score(p, p.target).correct


def test_data_source_and_grain_without_tensorflow(prepared):
  data_dir, configs = prepared
  config = configs["arithmetic"]
  source = tfds.data_source(f"procedural_tasks/{config.name}", data_dir=data_dir)
  test = source["test"]
  assert len(test) == 2 * get_task("arithmetic").num_difficulties
  ds = grain.MapDataset.source(test).map(Problem.from_record)
  first = ds[0]
  assert isinstance(first, Problem) and first.task == "arithmetic"
  assert first == get_task("arithmetic").generate(tb.split_seed(7, "test", 0), 0)
  assert "tensorflow" not in sys.modules


def test_train_and_test_seeds_disjoint():
  train = {tb.split_seed(0, "train", j) for j in range(1000)}
  test = {tb.split_seed(0, "test", j) for j in range(1000)}
  other = {tb.split_seed(1, "train", j) for j in range(1000)}
  assert not train & test and not train & other


def test_config_names():
  assert tb.ProceduralConfig.make("zebra").name == "zebra"
  a = tb.ProceduralConfig.make("arithmetic", chain=True)
  b = tb.ProceduralConfig.make("arithmetic", chain=True)
  c = tb.ProceduralConfig.make("arithmetic", seed=1)
  assert a.name == b.name != c.name and a.name.startswith("arithmetic_")
  with pytest.raises(ValueError):
    tb.load_split("gsm8k", "train", data_dir="/nonexistent")


def test_task_options_and_bins(tmp_path):
  config = tb.ProceduralConfig.make("arithmetic", bins=(1, 3), train_per_bin=3, test_per_bin=1,
                                    chain=True)
  problems = tb.load_split("arithmetic", "train", data_dir=str(tmp_path), config=config)
  task = get_task("arithmetic", chain=True)
  assert [p.difficulty for p in problems] == [1, 1, 1, 3, 3, 3]
  assert problems[0] == task.generate(tb.split_seed(0, "train", 0), 1)
