"""The fault-injection suite: each damage it inflicts is one the checkpoints' seal finds, and its
command runs cases end to end and tables them."""

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import pytest

from experiments.studies import faults
from rl_curriculum.train.durable import checkpointing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.mark.parametrize("kind", sorted(faults.DAMAGE))
def test_each_damage_kind_is_named_by_the_seal(kind, tmp_path):
  manager = checkpointing.make_manager(str(tmp_path / "ckpt"))
  checkpointing.save(manager, 1, {"w": jnp.arange(4096.0), "b": jnp.ones(3)}, {})
  manager.close()
  step = str(tmp_path / "ckpt" / "1")
  assert checkpointing.damage(step) is None
  damage, says = faults.DAMAGE[kind]
  damage(step)
  found = checkpointing.damage(step)
  assert found is not None and says in found


def test_the_table_counts_each_case_and_lists_each_result():
  results = [faults.Result("kill", "kill_0", True, "equal"),
             faults.Result("kill", "kill_1", False, "a | b"),
             faults.Result("bad_input", "--x", True, "exit 2")]
  lines = faults.table(results).splitlines()
  assert lines[2:5] == ["| kill | 2 | 1 | 1 |", "| bad_input | 1 | 1 | 0 |",
                        "| **all** | 3 | 2 | 1 |"]
  assert "| kill | kill_1 | **no** | a / b |" in lines


@pytest.mark.slow
def test_the_bad_input_cases_hold_end_to_end(tmp_path):
  result = subprocess.run([sys.executable, "-m", "experiments.studies.faults", "--cases=bad_input",
                           f"--work={tmp_path / 'work'}", f"--out_dir={tmp_path}"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
  assert result.returncode == 0, result.stdout + result.stderr
  with open(tmp_path / "faults.json") as f:
    report = json.load(f)
  assert [r["name"] for r in report["results"]] == [o for o, _ in faults.BAD_INPUT]
  assert all(r["held"] and r["detail"].startswith("exit 2: error: ") for r in report["results"])
  assert f"| bad_input | {len(faults.BAD_INPUT)} | {len(faults.BAD_INPUT)} | 0 |" in (
      tmp_path / "faults.md").read_text()
