"""Every experiment module imports next to every other one in one interpreter.

A test worker imports many experiment modules into one process, and absl flags are global: two
modules defining a flag of the same name at import time break the collection of every later test
file. Programs whose flags would clash define them only when run as `__main__`.
"""

import os
import subprocess
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_all_experiment_modules_import_together():
  names = sorted(n[:-3] for n in os.listdir(os.path.join(_ROOT, "experiments"))
                 if n.endswith(".py") and n != "__init__.py")
  assert "benchmark_compile" in names and "compare_curricula" in names
  code = "import importlib\n" + "".join(
      f"importlib.import_module('experiments.{n}')\n" for n in names) + "print('ok')\n"
  result = subprocess.run([sys.executable, "-c", code], cwd=_ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]
