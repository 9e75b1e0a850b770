"""TFDS builders that materialise fixed train/test splits of the procedural tasks (array_record).

  config = ProceduralConfig.make("arithmetic", train_per_bin=1000, test_per_bin=100, seed=0)
  builder = ProceduralTasks(config=config, data_dir="/data/tfds")   # file_format: array_record
  builder.download_and_prepare()
  source = builder.as_data_source(split="test")                    # random access, no TensorFlow
  problems = [Problem.from_record(source[i]) for i in range(len(source))]
  # or: load_split("arithmetic", "test", data_dir=..., config=config)
  # grain: grain.MapDataset.source(source).map(Problem.from_record)

Example j of bin b in split s is `task.generate(split_seed(config.seed, s, j), b)`; examples are
stored bin by bin in generation order (shuffling disabled), so a split is a pure function of the
config. Train and test seeds never coincide, but the easiest bins have few distinct problems
(add_1d_1d has 100), so there the splits necessarily repeat and overlap.

What works without TensorFlow here (tensorflow-datasets 4.9.10, measured): defining a
`GeneratorBasedBuilder`, `download_and_prepare()` with `file_format="array_record"`,
`builder.as_data_source()` and `tfds.data_source(name, data_dir=...)` (the builder module must be
imported so the name is registered), and grain's `MapDataset.source` on the result. What needs
TensorFlow: `tfds.load` / `builder.as_dataset` (they build a `tf.data.Dataset`) and the default
tfrecord file format. `dataset_info_from_configs` cannot be used for builders defined outside a
TFDS-style package folder (it reads metadata files next to the module), so `_info` builds the
`DatasetInfo` directly.
"""

import dataclasses
import hashlib
import json
import os
from typing import Optional, Sequence

import numpy as np
import tensorflow_datasets as tfds

from rl_curriculum.tasks import base

__all__ = ["ProceduralConfig", "ProceduralTasks", "split_seed", "load_split", "PROCEDURAL_TASKS"]

PROCEDURAL_TASKS = ("arithmetic", "countdown", "zebra", "arc1d")
_SPLIT_OFFSET = {"train": 0, "test": 1 << 40}


def split_seed(base_seed: int, split: str, index: int) -> int:
  """Seed of example `index` of `split`; train and test ranges are disjoint for index < 2^40."""
  return (int(base_seed) << 44) + _SPLIT_OFFSET[split] + int(index)


@dataclasses.dataclass
class ProceduralConfig(tfds.core.BuilderConfig):
  """One procedural task, some of its bins and the split sizes.

  task: registry name; task_options: JSON of keyword options for `get_task` (e.g. '{"chain":
  true}'); bins: bin indices in both splits (empty: the task's training bins in "train" and all
  bins, evaluation-only ones included, in "test"); train_per_bin /
  test_per_bin: examples per bin; seed: base seed.
  """
  task: str = "arithmetic"
  task_options: str = "{}"
  bins: tuple = ()
  train_per_bin: int = 1000
  test_per_bin: int = 100
  seed: int = 0

  @classmethod
  def make(cls, task: str, *, bins: Sequence[int] = (), train_per_bin: int = 1000,
           test_per_bin: int = 100, seed: int = 0, name: Optional[str] = None,
           **task_options) -> "ProceduralConfig":
    """A config whose name is `task` for the defaults, else `task_<hash of the settings>`."""
    options = json.dumps(task_options, sort_keys=True)
    settings = (options, tuple(int(b) for b in bins), int(train_per_bin), int(test_per_bin),
                int(seed))
    default = settings == ("{}", (), 1000, 100, 0)
    if name is None:
      digest = hashlib.sha1(repr(settings).encode()).hexdigest()[:10]
      name = task if default else f"{task}_{digest}"
    return cls(name=name, description=f"{task} {settings}", task=task, task_options=options,
               bins=settings[1], train_per_bin=settings[2], test_per_bin=settings[3],
               seed=settings[4])


class ProceduralTasks(tfds.core.GeneratorBasedBuilder):
  """Fixed splits of a procedural task; see the module docstring. One config per task by default.

  Features (all strings UTF-8; `tfds.data_source` returns them as bytes): task, prompt, question,
  answer, target, meta (JSON), difficulty (int32), seed (int64). `Problem.from_record` decodes.
  """
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Procedural tasks: arithmetic, countdown, zebra, arc1d."}
  BUILDER_CONFIGS = [ProceduralConfig.make(t) for t in PROCEDURAL_TASKS]

  def __init__(self, *, file_format: str = "array_record", **kwargs):
    super().__init__(file_format=file_format, **kwargs)

  def _info(self):
    text = tfds.features.Text()
    return tfds.core.DatasetInfo(
        builder=self,
        description="Procedurally generated verifiable problems in difficulty bins.",
        features=tfds.features.FeaturesDict({
            "task": text, "prompt": text, "question": text, "answer": text, "target": text,
            "meta": text, "difficulty": np.int32, "seed": np.int64}),
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # nothing to download
    return {"train": self._generate_examples("train"), "test": self._generate_examples("test")}

  def _generate_examples(self, split):
    from rl_curriculum.tasks import get_task  # pylint: disable=g-import-not-at-top
    cfg = self.builder_config
    task = get_task(cfg.task, **json.loads(cfg.task_options))
    # Default bins: the training bins in "train", every bin (evaluation-only ones too) in "test".
    bins = cfg.bins or (task.train_bins if split == "train" else range(task.num_difficulties))
    size = cfg.train_per_bin if split == "train" else cfg.test_per_bin
    for b in bins:
      for j in range(size):
        problem = task.generate(split_seed(cfg.seed, split, j), b)
        yield f"{b:04d}-{j:09d}", problem.to_record()


def load_split(task: str, split: str, data_dir: Optional[str] = None,
               config: Optional[ProceduralConfig] = None) -> list[base.Problem]:
  """The problems of `split` for `task`, preparing the array_record files first if needed.

  Args:
    task: a procedural task name (ignored when `config` is given).
    split: "train" or "test".
    data_dir: TFDS data folder (default $TFDS_DATA_DIR or ~/tensorflow_datasets).
    config: a `ProceduralConfig`; default: `ProceduralConfig.make(task)`.
  """
  if config is None:
    if task not in PROCEDURAL_TASKS:
      raise ValueError(f"unknown procedural task {task!r}; expected one of {PROCEDURAL_TASKS}")
    config = ProceduralConfig.make(task)
  data_dir = data_dir or os.environ.get("TFDS_DATA_DIR") or os.path.expanduser(
      "~/tensorflow_datasets")
  builder = ProceduralTasks(config=config, data_dir=data_dir)
  builder.download_and_prepare()
  source = builder.as_data_source(split=split)
  return [base.Problem.from_record(source[i]) for i in range(len(source))]
