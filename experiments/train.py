"""Train and evaluate: `python experiments/train.py --config configs/quickstart.py --workdir DIR`.

Overrides follow the config's field names, e.g. `--config.rl.steps=50
--config.curriculum.name=uniform`. Running the same command again resumes from the workdir.
"""

import os
import sys

# Config files may build on their siblings (`from configs import quickstart`).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags
from absl import logging
from ml_collections import config_flags

from rl_curriculum.train import builders
from rl_curriculum.train import loop

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run folder: checkpoints, logs, report.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # library INFO lines (checkpoint I/O) drown the progress
  try:
    loop.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  except builders.ConfigError as e:  # a bad field: one line naming it, no traceback
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  app.run(main)
