"""Writes docs/config_reference.md from the config files: every field, its default, its comment.

  python -m experiments.tools.config_reference            # rewrite docs/config_reference.md
  python -m experiments.tools.config_reference --check    # exit 1 if the file is out of date

The config files are the single source: each `c.section.field = value  # comment` line of a
`get_config()` gives one row. A field's comment is the trailing comment of its line, plus comment
lines directly above it and indented comment lines directly below it (continuations). Values are
read from the evaluated config, so `tuple(range(12))` shows as the tuple it makes. A config built
on another one (`c = scratch.get_config()`) is listed as its overrides, next to the defaults
they replace. A config file with variants (a `VARIANTS` tuple of the names its `get_config(arg)`
takes, as in `--config configs/compare.py:countdown`) is listed as one column per variant of every
field some variant sets away from the base config's default.
"""

import ast
import importlib
import io
import os
import sys
import tokenize
from typing import NamedTuple, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG_DIR = os.path.join(ROOT, "configs")
OUTPUT = os.path.join(ROOT, "docs", "config_reference.md")
FIRST = "scratch.py"  # the base config, listed first


class Field(NamedTuple):
  path: str      # dotted path below the config root, e.g. "rl.steps"
  comment: str   # the comment text, without '#'
  line: int      # line of the assignment in the file


class ConfigFile(NamedTuple):
  name: str                # module name, e.g. "scratch"
  docstring: str
  base: Optional[str]      # module the config starts from, or None for a fresh ConfigDict
  fields: list             # [Field] in file order (sections, i.e. empty ConfigDicts, excluded)


def _dotted(node) -> Optional[str]:
  """'a.b.c' for an attribute chain rooted at a Name, else None."""
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  if not isinstance(node, ast.Name):
    return None
  parts.append(node.id)
  return ".".join(reversed(parts))


def _comments(source: str) -> tuple[dict, set]:
  """({line: (column, text)} of every comment, set of lines holding code tokens)."""
  comments, code = {}, set()
  skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
          tokenize.ENCODING, tokenize.ENDMARKER)
  for tok in tokenize.generate_tokens(io.StringIO(source).readline):
    if tok.type == tokenize.COMMENT:
      comments[tok.start[0]] = (tok.start[1], tok.string.lstrip("#").strip())
    elif tok.type not in skip:
      code.update(range(tok.start[0], tok.end[0] + 1))
  return comments, code


def _is_empty_configdict(value) -> bool:
  return (isinstance(value, ast.Call) and not value.args and not value.keywords
          and (_dotted(value.func) or "").endswith("ConfigDict"))


def parse(path: str) -> ConfigFile:
  """Reads the fields a config file's `get_config()` assigns (see the module docstring).

  Raises:
    ValueError: the file has no get_config().
  """
  with open(path) as f:
    source = f.read()
  tree = ast.parse(source)
  comments, code = _comments(source)
  fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_config"),
            None)
  if fn is None:
    raise ValueError(f"{path} defines no get_config()")
  base, root, fields = None, None, []
  for stmt in ast.walk(fn):
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
      continue
    target = stmt.targets[0]
    if isinstance(target, ast.Name):  # c = ml_collections.ConfigDict() | c = other.get_config()
      root = target.id
      call = _dotted(stmt.value.func) if isinstance(stmt.value, ast.Call) else None
      if call and call.endswith(".get_config"):
        base = call.rsplit(".", 2)[-2]
      continue
    dotted = _dotted(target)
    if root is None or dotted is None or not dotted.startswith(root + "."):
      continue
    if _is_empty_configdict(stmt.value):
      continue  # a section
    fields.append(Field(path=dotted[len(root) + 1:], comment=_field_comment(stmt, comments, code),
                        line=stmt.lineno))
  return ConfigFile(name=os.path.splitext(os.path.basename(path))[0],
                    docstring=ast.get_docstring(tree) or "", base=base, fields=fields)


def _field_comment(stmt, comments: dict, code: set) -> str:
  """The comment of one assignment (see the module docstring), from `_comments`' output."""
  texts = []
  above = stmt.lineno - 1
  # A block comment above belongs to the field when it starts in the field's column; deeper
  # comment lines continue the previous field's trailing comment.
  while above in comments and above not in code and comments[above][0] == stmt.col_offset:
    above -= 1
  texts += [comments[i][1] for i in range(above + 1, stmt.lineno)]
  texts += [comments[i][1] for i in range(stmt.lineno, stmt.end_lineno + 1) if i in comments]
  below = stmt.end_lineno + 1
  while below in comments and below not in code and comments[below][0] > stmt.col_offset:
    texts.append(comments[below][1])
    below += 1
  return " ".join(texts)


class Variant(NamedTuple):
  base: Optional[str]  # module the variant's config starts from
  comments: dict       # {dotted path: comment} of the fields the variant's code path assigns


def _selected(test, arg: str) -> Optional[frozenset]:
  """Variants an `if` test selects (`arg == "x"` or `arg in ("x", "y")`); None for other tests."""
  if not (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
          and test.left.id == arg and len(test.ops) == 1):
    return None
  try:
    value = ast.literal_eval(test.comparators[0])
  except ValueError:
    return None
  if isinstance(test.ops[0], ast.Eq):
    return frozenset([value])
  if isinstance(test.ops[0], ast.In):
    return frozenset(value)
  return None


def parse_variants(path: str, variants: Sequence[str]) -> dict:
  """{variant: Variant} of a config file whose `get_config(arg)` takes a variant name.

  Follows get_config's statements with the set of variants that reach each one: an
  `if arg == "x":` (or `arg in (...)`) block is reached by those it selects, its `else` by the
  others, and a `return` ends the path of those that reach it. A field's comment is that of the
  last assignment of it on the variant's path.
  """
  with open(path) as f:
    source = f.read()
  comments, code = _comments(source)
  fn = next(n for n in ast.parse(source).body
            if isinstance(n, ast.FunctionDef) and n.name == "get_config")
  arg = fn.args.args[0].arg
  base = {v: None for v in variants}
  notes = {v: {} for v in variants}
  root = [None]

  def walk(stmts, live):
    for stmt in stmts:
      if isinstance(stmt, ast.If):
        chosen = _selected(stmt.test, arg)
        taken = live if chosen is None else live & chosen
        skipped = live if chosen is None else live - chosen
        live = walk(stmt.body, taken) | walk(stmt.orelse, skipped)
      elif isinstance(stmt, ast.Return):
        return frozenset()
      elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target = stmt.targets[0]
        call = _dotted(stmt.value.func) if isinstance(stmt.value, ast.Call) else None
        dotted = _dotted(target)
        if isinstance(target, ast.Name) and call and call.endswith(".get_config"):
          root[0] = target.id
          for v in live:
            base[v] = call.rsplit(".", 2)[-2]
        elif root[0] and dotted and dotted.startswith(root[0] + "."):
          for v in live:
            notes[v][dotted[len(root[0]) + 1:]] = _field_comment(stmt, comments, code)
    return live

  walk(fn.body, frozenset(variants))
  return {v: Variant(base=base[v], comments=notes[v]) for v in variants}


def _module(name: str):
  """The config module configs/NAME.py (the repository root is on sys.path under `python -m`)."""
  return importlib.import_module(f"configs.{name}")


def _load(name: str):
  return _module(name).get_config()




def _lookup(config, path: str):
  node = config
  for part in path.split("."):
    if part not in node:
      return _MISSING
    node = node[part]
  return node


_MISSING = object()


def _value(value) -> str:
  if value is _MISSING:
    return "(not set)"
  if hasattr(value, "to_dict"):
    value = value.to_dict()
  return "`" + repr(value).replace("|", "\\|") + "`"


def _cell(text: str) -> str:
  return text.replace("|", "\\|")


def _summary(docstring: str) -> list:
  """The docstring's first line and its indented command lines (runs of spaces, as a
  backslash-continued line leaves them, read as one)."""
  lines = docstring.splitlines()
  out = [lines[0]] if lines else []
  commands = [" ".join(l.split()) for l in lines[1:] if l.startswith("  ") and l.strip()
              and l.strip().split()[0] in ("python", "make")]
  if commands:
    out += ["", "```bash", *commands, "```"]
  return out


def leaf_paths(config, prefix: str = "") -> list:
  """Dotted paths of every leaf of an evaluated config (nested ConfigDicts expanded)."""
  out = []
  for key in config.keys():
    value = config[key]
    path = f"{prefix}{key}"
    if hasattr(value, "keys"):
      out += leaf_paths(value, path + ".")
    else:
      out.append(path)
  return out


def _variant_note(path: str, parsed: dict, base_comments: dict) -> str:
  """The note of one field of a config with variants: its comment on each variant's path (or in
  the config file the variant starts from, unless that is the base config), each labelled with
  the variants it is for unless every variant shares it."""
  by_comment = {}
  for v, variant in parsed.items():
    text = variant.comments.get(path) or base_comments.get(variant.base, {}).get(path, "")
    if text:
      by_comment.setdefault(text, []).append(v)
  if len(by_comment) == 1 and len(next(iter(by_comment.values()))) == len(parsed):
    return next(iter(by_comment))
  return "; ".join(", ".join(f"`:{v}`" for v in vs) + f": {text}"
                   for text, vs in by_comment.items())


def _variant_table(path: str, name: str, variants: Sequence[str], others: dict) -> list:
  """Markdown lines of a config file with variants: one row per field that some variant sets away
  from the base config's default, one column per variant. `others`: {name: ConfigFile} of the
  other config files, whose comments note the fields a variant takes from them."""
  module = _module(name)
  configs = {v: module.get_config(v) for v in variants}
  parsed = parse_variants(path, variants)
  base_name = os.path.splitext(FIRST)[0]
  base = _load(base_name)
  base_comments = {n: {f.path: f.comment for f in c.fields} for n, c in others.items()
                   if n != base_name}
  paths = []
  for config in configs.values():
    for leaf in leaf_paths(config):
      if leaf not in paths and any(_lookup(c, leaf) != _lookup(base, leaf)
                                   for c in configs.values()):
        paths.append(leaf)
  columns = " | ".join(f"`:{v}`" for v in variants)
  out = [f"Variants (`--config configs/{name}.py:NAME`): "
         + ", ".join(f"`{v}`" for v in variants) + ". Each starts from "
         f"[`configs/{base_name}.py`](#configs{base_name}py) or a config built on it, and "
         "changes:", "",
         f"| field | {columns} | {base_name} default | note |",
         "|---|" + "---|" * len(variants) + "---|---|"]
  for leaf in paths:
    values = " | ".join(_value(_lookup(c, leaf)) for c in configs.values())
    out.append(f"| `{leaf}` | {values} | {_value(_lookup(base, leaf))} | "
               f"{_cell(_variant_note(leaf, parsed, base_comments))} |")
  return out + [""]


def config_files(config_dir: str = CONFIG_DIR) -> list:
  """Config file paths, the base config first, then by name."""
  names = sorted(n for n in os.listdir(config_dir) if n.endswith(".py") and n != "__init__.py")
  names.sort(key=lambda n: n != FIRST)
  return [os.path.join(config_dir, n) for n in names]


def render(config_dir: str = CONFIG_DIR) -> str:
  """The whole reference as Markdown."""
  out = [
      "# Config reference",
      "",
      "<!-- Generated by experiments/tools/config_reference.py from configs/*.py; do not edit. -->",
      "",
      "Generated from the config files by `python -m experiments.tools.config_reference` (a",
      "test checks that this page matches them). Every config is an `ml_collections` file whose",
      "`get_config()` sets each field with a comment; the entrypoints lock it",
      "(`lock_config=True`), so a misspelt override fails at once. Override any field on the",
      "command line: `--config.rl.steps=50 --config.curriculum.name=uniform",
      "--config.curriculum.options={}` (another curriculum takes other options).",
      "See [running.md](running.md) for what to run and [concepts.md](concepts.md) for what the",
      "fields mean in the RL step.",
      "",
  ]
  paths = config_files(config_dir)
  parsed = [parse(p) for p in paths]
  by_name = {c.name: c for c in parsed}
  out += ["Config files: " + ", ".join(f"[`configs/{c.name}.py`](#configs{c.name}py)"
                                       for c in parsed), ""]
  for path, cfg in zip(paths, parsed):
    out += [f"## configs/{cfg.name}.py", ""] + _summary(cfg.docstring) + [""]
    variants = getattr(_module(cfg.name), "VARIANTS", None)
    if variants:
      out += _variant_table(path, cfg.name, variants, by_name)
      continue
    config = _load(cfg.name)
    if cfg.base is None:
      sections = {}
      for field in cfg.fields:
        section = field.path.split(".")[0] if "." in field.path else "(top level)"
        sections.setdefault(section, []).append(field)
      for section, fields in sections.items():
        out += [f"### {section}", "", "| field | default | meaning |", "|---|---|---|"]
        for field in fields:
          out.append(f"| `{field.path}` | {_value(_lookup(config, field.path))} | "
                     f"{_cell(field.comment)} |")
        out.append("")
    else:
      base = _load(cfg.base)
      out += [f"Starts from [`configs/{cfg.base}.py`](#configs{cfg.base}py) and changes:", "",
              f"| field | value | {cfg.base} default | note |", "|---|---|---|---|"]
      seen = set()
      for field in cfg.fields:
        if field.path in seen:
          continue
        seen.add(field.path)
        out.append(f"| `{field.path}` | {_value(_lookup(config, field.path))} | "
                   f"{_value(_lookup(base, field.path))} | {_cell(field.comment)} |")
      out.append("")
  return "\n".join(out).rstrip() + "\n"


def main(argv) -> int:
  check = "--check" in argv[1:]
  text = render()
  if check:
    with open(OUTPUT) as f:
      if f.read() != text:
        print(f"{os.path.relpath(OUTPUT, ROOT)} is out of date: run "
              "python -m experiments.tools.config_reference", file=sys.stderr)
        return 1
    return 0
  with open(OUTPUT, "w") as f:
    f.write(text)
  print(f"wrote {os.path.relpath(OUTPUT, ROOT)}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
