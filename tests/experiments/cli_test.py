"""Every entry point prints a mistyped flag or config override as one line, with exit status 2."""

import os
import subprocess
import sys

import pytest

from experiments import cli
import test_util

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_TYPO = ("--config.seed_typo=1",
         "error: --config.seed_typo=1: the config has no field config.seed_typo")


def _config(name: str) -> str:
  return "--config=" + os.path.join(ROOT, "configs", name)


@pytest.mark.parametrize("entry_point,args,line", test_util.fast_first([
    ("evaluate", [_config("toy.py"), "--workdir=unused", _TYPO[0]], _TYPO[1]),
    ("plan", [_config("toy.py"), _TYPO[0]], _TYPO[1]),
    ("sample", [_config("sample.py"), _TYPO[0]], _TYPO[1]),
    ("studies.compare_curricula", [_config("compare.py:scratch"), _TYPO[0]], _TYPO[1]),
    ("export", ["--workdir=unused", "--out=unused", "--formatt=peft"],
     "error: Unknown command line flag 'formatt'. Did you mean: format ?"),
]))
def test_a_mistyped_flag_is_one_line_and_exit_2(entry_point, args, line, tmp_path):
  result = subprocess.run([sys.executable, "-m", f"experiments.{entry_point}", *args],
                          capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                          env={**os.environ, "PYTHONPATH": ROOT})
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip().splitlines() == [line]
  assert os.listdir(tmp_path) == []  # nothing was written


def test_an_error_names_the_override_it_is_about_when_a_field_is_given_twice():
  argv = ["train", "--config.rl.steps=6", "--config.rl.steps=many", "--config.eval.every=2"]
  error = ValueError("flag --config.rl.steps=many: invalid literal for int() with base 10: 'many'")
  assert cli.describe_flag_error(argv, error) == str(error)
  argv = ["train", "--config.rl.stepz=6", "--config.eval.every=2", "--config.rl.stepz=7"]
  assert cli.describe_flag_error(argv, KeyError("'stepz'")) == (
      "--config.rl.stepz=7: the config has no field config.rl.stepz")
