"""docs/methods.md stays true: every row's flags make a valid config and reach what the run is
built from, every curriculum, filter and algorithm has a row, every test a row names exists, and
each family of methods trains one RL step with its rows' flags as written."""

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

from rl_curriculum.train import loop
from rl_curriculum.train.learn import rl_types
from rl_curriculum.train.report import figures
from rl_curriculum.train.report.metrics import read_jsonl
from rl_curriculum.train.rollout import budget, checks as rollout_checks, pipeline
from rl_curriculum.train.setup import builders, validation
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
# Every row's flags reach what the run is built from (cheap, no training), and one RL step per
# family of methods trains with the family's flags merged into one config.
# ------------------------------------------------------------------------------------------------

def signature(config: ml_collections.ConfigDict) -> dict:
  """What the run's programs and loop are made from, as the run derives it: the learn program's
  settings (`LearnConfig`: its switches, shapes and traced coefficients), the curriculum its
  select and update build (name, options, arms, filter), the rollout engine and schedule, the
  completion slots, the policy's adapters, the task mixture and the recovery settings."""
  c = config
  return {
      "learn": builders.learn_config(c),
      "curriculum": (c.curriculum.name, json.dumps(c.curriculum.options.to_dict(),
                                                   sort_keys=True), c.curriculum.arms,
                     c.curriculum.filter, builders.sampled_prompts(c), tuple(c.curriculum.band)),
      "rollout": (c.rl.engine, c.rl.decode_slots, pipeline.persists(c), pipeline.generations(c),
                  c.rl.decode_budget, c.rl.admission, rollout_checks.in_flight(c)),
      "slots": (budget.group_slots(c), c.rl.allocation, budget.needs_prompt_stats(c)),
      "model": (c.model.lora_rank, c.model.lora_merge_every, tuple(c.model.lora_targets)),
      "task": (c.task.name, tuple(c.task.train_bins), tuple(c.task.weights)),
      "recovery": (c.checkpoint.rollback_after, c.checkpoint.collapse_after)}


@pytest.mark.parametrize("row", _params(ROWS))
def test_row_flags_reach_what_the_run_is_built_from(row):
  """The row's flags change the run's `signature` (a learn-program switch or coefficient, the
  curriculum, the rollout schedule, ...): a flag that parses but nothing reads fails here. A
  row whose flags spell the default config names the default's own methods."""
  config, default = config_with(row.flags), config_with([])
  if config.to_dict() == default.to_dict():
    assert _row_id(row) in _DEFAULTS, f"{row.method}: its flags spell the default config"
    return
  mine, theirs = signature(config), signature(default)
  assert any(mine[k] != theirs[k] for k in mine), (
      f"{row.method}: its flags change nothing the run is built from")


# Rows whose flags spell configs/toy.py as it is (the default's own methods: the default step
# below trains them).
_DEFAULTS = ("sec_self_evolving_curriculum_sec", "rloo_rloo", "importance_ratio_guard",
             "rollback_past_a_kl_bound", "clip_higher", "token_mean_aggregation")

# One RL step per family: each family's rows' flags merged into one config (a field set by two
# rows must agree). The other rows' methods are covered by the tests their rows name (each
# curriculum's own tests and the simulated learner's; the estimators' and losses' kernels; the
# engine's and the pipeline's end-to-end tests).
FAMILIES = {
    "default": _DEFAULTS,
    "critic": ("ppo_with_a_critic_and_gae_ppo", "value_loss_into_the_trunk",
               "kl_folded_into_the_reward", "dual_clip", "entropy_bonus",
               "several_optimizer_steps_per_batch", "gradient_accumulation"),
    "group_objective": ("grpo_with_the_sample_std", "kl_to_the_reference_as_a_loss_k2",
                        "gspo_sequence_level_ratio", "sequence_mean_of_token_means",
                        "decoupled_ppo_proximal_policy_interpolated_a_3po",
                        "capo_advantage_sign_curriculum", "overlong_filtering",
                        "reward_whitening", "curriculum_fed_the_shaped_reward",
                        "adaptive_sampling_temperature"),
    "dr_grpo": ("dr_grpo_dr_grpo", "soft_overlong_punishment",
                "dynamic_sampling_all_equal_filter_all_equal"),
    "budgets_and_adapters": ("counterfactual_baseline", "rollout_allocation_by_posterior_variance",
                             "lora", "relora_lora_merged_and_restarted",
                             "rollback_to_the_last_healthy_checkpoint"),
    "rollouts_in_flight": ("partial_rollouts", "late_groups_dropped_rl_admission_drop"),
    "skipped_before_rollout": ("greso_greso",),
    "prompt_features": ("pcl_prompt_curriculum_with_a_value_model_pcl",),
    "training_mask": ("vcrl_s_training_mask",),
    "mixture": ("task_mixture_sec_over_task_bin_arms_2_d_sec", "mixture_weights"),
    "environments": ("multi_turn_tool_episodes_sec_over_environment_level_arms",
                     "horizon_schedule_tti", "dump_over_environment_level_arms"),
    "horizon_bandit": ("horizon_bandit",),
}
_BY_ID = {_row_id(r): r for r in ROWS}


def family_flags(name: str) -> list[str]:
  """The flags of a family's rows merged, in table order (a field given twice once)."""
  merged = {}
  for row_id in FAMILIES[name]:
    for flag in _BY_ID[row_id].flags:
      field, _, value = flag.partition("=")
      assert merged.get(field, value) == value, f"{name}: {field} set to two values"
      merged[field] = value
  return [f"{field}={value}" for field, value in merged.items()]


def test_families_name_rows_of_the_table_and_make_valid_configs():
  named = [row_id for rows in FAMILIES.values() for row_id in rows]
  assert not set(named) - set(_BY_ID), "families name rows the table does not hold"
  assert len(named) == len(set(named)), "a row in two families"
  for name in FAMILIES:
    validation.validate(config_with(family_flags(name)))


# Wall-clock measurements differ between runs by nature; every other metric is deterministic.
_TIMING = ("time/", "tokens_per_s")


def _one_step(overrides, workdir: str) -> dict:
  """The metrics row of step 1 of configs/toy.py with `overrides`, from the test run's shared
  warm start of those settings (rows that change the model, e.g. LoRA, share theirs)."""
  config = config_with([*overrides, "--config.rl.steps=1"])
  test_util.copy_warm_start(test_util.shared_warm_start(config), workdir)
  # The plots of report.png are not what a row is about (tests/train/report/metrics_test.py
  # checks them); drawing them would take a sixth of a step's time.
  with mock.patch.object(figures, "write_report", lambda *args, **kwargs: {}):
    loop.train_and_evaluate(config, workdir)
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows] == [0, 1]
  return {k: v for k, v in rows[-1].items() if not k.startswith(_TIMING)}


@pytest.fixture(scope="module")
def default_step(tmp_path_factory):
  """Step 1 of configs/toy.py as it is: what a family's step is compared with."""
  return _one_step([], str(tmp_path_factory.mktemp("default") / "run"))


# A step on episodes builds the environments' own warm start and plays held-out episodes: a
# minute on two cores (the slow suite).
_SLOW_FAMILIES = ("environments", "horizon_bandit")


@pytest.mark.parametrize("family", [
    pytest.param(f, marks=pytest.mark.slow) if f in _SLOW_FAMILIES else f
    for f in FAMILIES if f != "default"])
def test_each_family_trains_one_rl_step_with_its_flags_as_written(family, default_step,
                                                                   tmp_path):
  """A family's merged flags train one RL step without a skipped update, and the step differs
  from the default config's (same seed, same warm start): a metric changes or appears."""
  step = _one_step(family_flags(family), str(tmp_path / "run"))
  assert np.isfinite(step["loss"]) and step["skipped_total"] == 0
  changed = sorted(k for k in set(step) | set(default_step)
                   if step.get(k, "absent") != default_step.get(k, "absent"))
  assert changed, f"{family}: its flags changed nothing in the step's metrics"


def test_the_default_step_trains(default_step):
  assert np.isfinite(default_step["loss"]) and default_step["skipped_total"] == 0
