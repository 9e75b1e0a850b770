"""Every experiment, study, tool and benchmark module imports next to every other one in one
interpreter.

A test worker imports many of these modules into one process, and absl flags are global: two
modules defining a flag of the same name at import time break the collection of every later test
file. Programs whose flags would clash define them only when run as `__main__`. Covered: every
module of the packages experiments/ (studies/, tools/) and benchmarks/ (speed/, `__main__`
included); benchmarks/peers/ and benchmarks/gpu/ are scripts for other environments (.venv-tunix,
a GPU machine), not packages, and are left out.
"""

import os
import subprocess
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


_PACKAGES = ("experiments", "benchmarks")


def _modules() -> list:
  """Dotted names of every module of `_PACKAGES` and of their subpackages (folders with an
  __init__.py), packages included."""
  names = []
  for top in _PACKAGES:
    for folder, subfolders, files in os.walk(os.path.join(_ROOT, top)):
      if "__init__.py" not in files:
        subfolders.clear()  # not a package: nothing below it is imported
        continue
      package = os.path.relpath(folder, _ROOT).replace(os.sep, ".")
      names.append(package)
      names += [f"{package}.{n[:-3]}" for n in sorted(files)
                if n.endswith(".py") and n != "__init__.py"]
  return sorted(names)


def test_all_experiment_modules_import_together():
  names = _modules()
  assert {"experiments.train", "experiments.studies.compare_curricula",
          "experiments.tools.config_reference", "benchmarks.compile", "benchmarks.speed.__main__",
          "benchmarks.speed.suite"} <= set(names), names
  code = "import importlib\n" + "".join(
      f"importlib.import_module('{n}')\n" for n in names) + "print('ok')\n"
  result = subprocess.run([sys.executable, "-c", code], cwd=_ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]
