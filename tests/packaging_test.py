"""The installed package declares every distribution it imports, and every module imports.

Two checks: (1) a static scan of the package's import statements, mapped to the distributions
that provide them, against the dependencies declared in pyproject.toml; (2) each module imported
in a fresh subprocess from the installed package (not from the source tree on sys.path).
"""

import ast
import importlib.metadata
import os
import pathlib
import re
import subprocess
import sys
import tomllib


ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rl_curriculum"


def _modules():
  for path in sorted(PACKAGE.rglob("*.py")):
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
      parts = parts[:-1]
    yield ".".join(parts), path


def _top_level_imports(path):
  """Absolute top-level module names imported anywhere in a file (lazy imports included)."""
  names = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      names.update(alias.name.split(".")[0] for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      names.add(node.module.split(".")[0])
  return names


def _normalise(name):
  return re.sub(r"[-_.]+", "-", name).lower()


def _declared():
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  reqs = list(project["dependencies"])
  for extra in project.get("optional-dependencies", {}).values():
    reqs.extend(extra)
  return {_normalise(re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0]) for r in reqs}


def test_every_imported_distribution_is_declared():
  provided_by = importlib.metadata.packages_distributions()
  declared = _declared()
  stdlib = set(sys.stdlib_module_names)
  missing = {}
  for module, path in _modules():
    for name in _top_level_imports(path):
      if name in stdlib or name == "rl_curriculum" or name == "__future__":
        continue
      dists = {_normalise(d) for d in provided_by.get(name, [])}
      if not dists:
        missing.setdefault(f"{name} (no installed distribution)", []).append(module)
      elif not dists & declared:
        missing.setdefault(f"{name} from {sorted(dists)}", []).append(module)
  assert not missing, f"imports not declared in pyproject.toml: {missing}"


def test_every_module_imports_from_installed_package(tmp_path):
  # One fresh interpreter, started in an empty folder so the source tree is not on sys.path.
  modules = [m for m, _ in _modules()]
  code = (
      "import importlib, traceback, rl_curriculum\n"
      f"failed = []\n"
      f"for m in {modules!r}:\n"
      "  try:\n"
      "    importlib.import_module(m)\n"
      "  except Exception:\n"
      "    failed.append(m + ': ' + traceback.format_exc(limit=2))\n"
      "print('\\n'.join(failed))\n"
      "print('FROM', rl_curriculum.__file__)\n"
      "raise SystemExit(1 if failed else 0)\n")
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
  assert "FROM " in result.stdout and str(tmp_path) not in result.stdout
