"""docs/methods.md stays true: every row's flags make a valid config, every curriculum, filter and
algorithm has a row, every test a row names exists, and every row trains as written (slow)."""

import ast
import json
import os
import re
from typing import NamedTuple
from unittest import mock

from absl import flags
import ml_collections
from ml_collections import config_flags
import numpy as np
import pytest

from rl_curriculum.train.rollout import budget

from rl_curriculum.train.setup import builders, validation

from rl_curriculum.train import loop

from rl_curriculum.train.report import figures

from rl_curriculum.train.learn import rl_types
from rl_curriculum.train.report.metrics import read_jsonl
import test_util

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE = os.path.join(ROOT, "docs", "methods.md")
TOY = os.path.join(ROOT, "configs", "toy.py")
HEADER = "| method | paper | flags | what it changes in the step | test |"


class Row(NamedTuple):
  """One row of the table."""
  method: str               # the method cell, as written
  flags: tuple[str, ...]    # the `--config.<field>=<value>` overrides, in order
  tests: tuple[str, ...]    # "path" or "path::function", relative to the repository root


def parse_table(text: str) -> list[Row]:
  """The rows of the one table whose header is HEADER; cells hold no "|" of their own."""
  lines = text.splitlines()
  assert lines.count(HEADER) == 1, f"docs/methods.md must hold one table headed {HEADER!r}"
  start = lines.index(HEADER) + 2  # the header, then the --- separator
  rows = []
  for line in lines[start:]:
    if not line.startswith("|"):
      break
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    assert len(cells) == 5, f"a row needs 5 cells, got {len(cells)}: {line}"
    method, _, flag_cell, _, test_cell = cells
    rows.append(Row(method=method, flags=tuple(re.findall(r"`(--config\.[^`]+)`", flag_cell)),
                    tests=tuple(re.findall(r"`(tests/[^`]+)`", test_cell))))
  return rows


def _read_rows() -> list[Row]:
  with open(TABLE) as f:
    return parse_table(f.read())


ROWS = _read_rows()


def _row_id(row: Row) -> str:
  return re.sub(r"[^a-z0-9]+", "_", row.method.lower()).strip("_")


def _params(rows):
  return [pytest.param(row, id=_row_id(row)) for row in rows]


def field_of(flag: str) -> str:
  """"rl.kl_coef" of "--config.rl.kl_coef=0.01"."""
  return flag[len("--config."):].partition("=")[0]


def has_field(config: ml_collections.ConfigDict, path: str) -> bool:
  node = config
  for part in path.split("."):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      return False
    node = node[part]
  return True


def config_with(overrides) -> ml_collections.ConfigDict:
  """configs/toy.py's config with `overrides` applied as the command line applies them
  (`experiments/train.py`: absl's config_flags, lock_config=True)."""
  argv = ["methods_table_test", f"--config={TOY}", *overrides]
  values = flags.FlagValues()
  # sys_argv: config_flags defines one flag per override it finds in the arguments.
  config_flags.DEFINE_config_file("config", None, "Experiment config file.", flag_values=values,
                                  lock_config=True, sys_argv=argv)
  values(argv)
  return values.config


def test_table_has_rows_with_flags_and_tests():
  assert len(ROWS) >= len(builders.CURRICULA) + len(rl_types.ALGORITHMS)
  for row in ROWS:
    assert row.flags, f"{row.method}: no `--config.<field>=<value>` flag"
    assert row.tests, f"{row.method}: no test named"
  names = [_row_id(r) for r in ROWS]
  assert len(set(names)) == len(names), "two rows name the same method"


@pytest.mark.parametrize("row", _params(ROWS))
def test_row_flags_make_a_valid_toy_config(row):
  config = config_with(row.flags)
  validation.validate(config)
  for flag in row.flags:  # the flag took effect (a typo in a value would fail to parse anyway)
    assert has_field(config, field_of(flag)), flag


def _rows_setting(flag_prefix: str) -> set[str]:
  """The values the rows give one field ("sec" of --config.curriculum.name=sec)."""
  return {f[len(flag_prefix):] for r in ROWS for f in r.flags if f.startswith(flag_prefix)}


def test_every_curriculum_filter_and_algorithm_has_a_row():
  curricula = _rows_setting("--config.curriculum.name=")
  filters = _rows_setting("--config.curriculum.filter=")
  algorithms = _rows_setting("--config.rl.algorithm=")
  assert not set(builders.CURRICULA) - curricula, "curricula without a row in docs/methods.md"
  # "none" is the absence of a filter, not a method.
  assert not set(builders.FILTERS) - {"none"} - filters, "filters without a row"
  assert not set(rl_types.ALGORITHMS) - algorithms, "algorithms without a row"
  allocations = _rows_setting("--config.rl.allocation=")
  assert not set(budget.ALLOCATIONS) - {"none"} - allocations, "allocations without a row"


def _functions(path: str) -> set[str]:
  with open(path) as f:
    tree = ast.parse(f.read())
  return {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}


@pytest.mark.parametrize("row", _params(ROWS))
def test_named_tests_exist(row):
  for ref in row.tests:
    path, _, name = ref.partition("::")
    assert os.path.isfile(os.path.join(ROOT, path)), f"{row.method}: no file {path}"
    if name:
      assert name in _functions(os.path.join(ROOT, path)), f"{row.method}: no {name} in {path}"


def test_parse_table_reads_cells():
  text = "\n".join([
      "intro", HEADER, "| --- | --- | --- | --- | --- |",
      "| A (`a`) | P | `--config.curriculum.name=a` `--config.curriculum.options={}` | x. | "
      "`tests/a_test.py::test_a`, `tests/b_test.py` |",
      "| B | — | `--config.rl.new_field=2.0` | y. | `tests/c_test.py` |",
      "", "| other | table |"])
  assert parse_table(text) == [
      Row("A (`a`)", ("--config.curriculum.name=a", "--config.curriculum.options={}"),
          ("tests/a_test.py::test_a", "tests/b_test.py")),
      Row("B", ("--config.rl.new_field=2.0",), ("tests/c_test.py",))]


def test_config_with_parses_values_as_the_command_line_does():
  c = config_with(["--config.curriculum.name=uniform", "--config.curriculum.options={}",
                   "--config.curriculum.oversample=2", "--config.curriculum.band=(0.1,0.9)",
                   "--config.rl.whiten_rewards=True"])
  assert c.curriculum.name == "uniform" and not dict(c.curriculum.options)
  assert c.curriculum.oversample == 2.0 and tuple(c.curriculum.band) == (0.1, 0.9)
  assert c.rl.whiten_rewards is True
  with pytest.raises((AttributeError, KeyError, flags.Error), match="no_such_field"):
    config_with(["--config.rl.no_such_field=1"])


# ------------------------------------------------------------------------------------------------
# Every row trains for one RL step with its flags as written (about 10 s a row on a 2-core CPU,
# the learn program compiled anew for each), and the flags change what that step does.
# ------------------------------------------------------------------------------------------------

# Wall-clock measurements differ between runs by nature; every other metric is deterministic.
_TIMING = ("time/", "tokens_per_s")


def _one_step(overrides, workdir: str) -> dict:
  """The metrics row of step 1 of configs/toy.py with `overrides`, from the test run's shared
  warm start of those settings (rows that change the model, e.g. LoRA, share theirs)."""
  config = config_with([*overrides, "--config.rl.steps=1"])
  test_util.copy_warm_start(test_util.shared_warm_start(config), workdir)
  # The plots of report.png are not what a row is about (tests/train/report/metrics_test.py checks
  # them); drawing them would take a sixth of a row's time.
  with mock.patch.object(figures, "write_report", lambda *args, **kwargs: {}):
    loop.train_and_evaluate(config, workdir)
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows] == [0, 1]
  return {k: v for k, v in rows[-1].items() if not k.startswith(_TIMING)}


# Methods that act only on tokens far from the sampling policy: one step at the toy's learning
# rate leaves every metric as it is (GSPO's sequence ratio equals the token ratios where they are
# 1; the dual clip engages above a ratio of c = 3). For these the flags must reach the learn
# step's configuration; the tests their rows name check the effect on off-policy batches.
_OFF_POLICY_ONLY = ("gspo_sequence_level_ratio", "dual_clip")


@pytest.fixture(scope="module")
def default_step(tmp_path_factory):
  """Step 1 of configs/toy.py as it is: what a row's flags are compared with."""
  return _one_step([], str(tmp_path_factory.mktemp("default") / "run"))


# Step 1 of each config the rows make, by the config: rows whose flags make the same config (a
# method and a setting it enforces, say) train it once.
_STEPS = {}


@pytest.mark.slow
@pytest.mark.parametrize("row", _params(ROWS))
def test_row_trains_one_rl_step(row, default_step, tmp_path):
  """The row's flags as written train one RL step without a skipped update, and that step
  differs from the default config's step (same seed, same warm start): a metric changes or
  appears (`_OFF_POLICY_ONLY`: the learn step's configuration changes). A row whose flags spell
  the default config (the default's own methods) trains as `default_step` does."""
  config, default = config_with(row.flags), config_with([])
  if config.to_dict() == default.to_dict():
    step = default_step
  else:
    key = json.dumps(config.to_dict(), sort_keys=True, default=str)
    if key not in _STEPS:
      _STEPS[key] = _one_step(row.flags, str(tmp_path / "run"))
    step = _STEPS[key]
  assert np.isfinite(step["loss"]) and step["skipped_total"] == 0
  if step is default_step:
    return
  changed = sorted(k for k in set(step) | set(default_step)
                   if step.get(k, "absent") != default_step.get(k, "absent"))
  if _row_id(row) in _OFF_POLICY_ONLY:
    assert builders.learn_config(config) != builders.learn_config(default), row.method
  else:
    assert changed, f"{row.method}: its flags changed nothing in the step's metrics"


def test_rows_without_an_effect_in_one_step_are_rows():
  assert set(_OFF_POLICY_ONLY) <= {_row_id(r) for r in ROWS}
