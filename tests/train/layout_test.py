"""The package's layout keeps its rules: the learn program's imports, file and function sizes."""

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "rl_curriculum")
# What the learn program may not import: the run's other rooms, the loop and planner around it.
_NOT_FROM_LEARN = ("rl_curriculum.train.rollout", "rl_curriculum.train.setup",
                   "rl_curriculum.train.durable", "rl_curriculum.train.report",
                   "rl_curriculum.train.loop", "rl_curriculum.train.programs",
                   "rl_curriculum.plan")
MAX_FILE_LINES = 450
MAX_FUNCTION_CODE_LINES = 60


def _modules(*parts):
  folder = os.path.join(PACKAGE, *parts)
  for root, _, names in os.walk(folder):
    for name in sorted(names):
      if name.endswith(".py"):
        yield os.path.join(root, name)


def _imported(path):
  """Every module `path` imports, as dotted names (`from a.b import c` gives a.b and a.b.c)."""
  with open(path) as f:
    tree = ast.parse(f.read())
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      yield node.module
      yield from (f"{node.module}.{alias.name}" for alias in node.names)


def test_the_learn_program_imports_nothing_from_rollout_setup_durability_or_reporting():
  bad = {os.path.relpath(path, ROOT): sorted(m for m in _imported(path)
                                              if m.startswith(_NOT_FROM_LEARN))
         for path in _modules("train", "learn")}
  assert not {k: v for k, v in bad.items() if v}


def test_a_forbidden_import_is_seen(tmp_path):
  path = tmp_path / "m.py"
  path.write_text("import jax\nfrom rl_curriculum.train.rollout import pipeline\n"
                  "def f():\n  from rl_curriculum.train import loop\n")
  assert {m for m in _imported(str(path)) if m.startswith(_NOT_FROM_LEARN)} == {
      "rl_curriculum.train.rollout", "rl_curriculum.train.rollout.pipeline",
      "rl_curriculum.train.loop"}


def test_no_file_of_the_package_is_over_the_line_limit():
  long = {os.path.relpath(p, ROOT): n for p in _modules() if (n := len(open(p).readlines()))
          > MAX_FILE_LINES}
  assert not long, f"files over {MAX_FILE_LINES} lines: {long}"


def code_lines(node: ast.AST, source_lines: list) -> int:
  """Lines of a function that hold code: not blank, not only a comment, not its docstring."""
  doc = set()
  body = getattr(node, "body", [])
  if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None),
                                                          ast.Constant):
    doc = set(range(body[0].lineno, body[0].end_lineno + 1))
  count = 0
  for n in range(node.lineno, node.end_lineno + 1):
    text = source_lines[n - 1].strip()
    if text and not text.startswith("#") and n not in doc:
      count += 1
  return count


def _long_functions(path):
  with open(path) as f:
    source = f.read()
  lines = source.splitlines()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      n = code_lines(node, lines)
      if n > MAX_FUNCTION_CODE_LINES:
        yield f"{os.path.relpath(path, ROOT)}::{node.name} ({n})"


@pytest.mark.parametrize("room", ["train", "rl"])
def test_no_function_of_the_run_or_the_kernels_is_over_the_code_line_limit(room):
  long = [f for path in _modules(room) for f in _long_functions(path)]
  assert not long, f"functions over {MAX_FUNCTION_CODE_LINES} code lines: {long}"


def test_code_lines_count_neither_blanks_comments_nor_the_docstring():
  source = 'def f(x):\n  """Doc.\n\n  More."""\n  # why\n\n  y = x\n  return y\n'
  node = ast.parse(source).body[0]
  assert code_lines(node, source.splitlines()) == 3  # def, y = x, return
