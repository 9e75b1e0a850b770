"""What the entry points share: flags parsed into one line of error, and run errors printed so.

  app.run(main, flags_parser=cli.parse_flags)

A mistyped override (`--config.rl.learning_rat=1e-3`, `--config.rl.steps=many`) fails while absl
parses the command line, before `main` runs, with a traceback of ml_collections internals;
`parse_flags` prints one line naming the override instead and exits with status 2.
"""

import re
import sys

from absl import flags

USAGE_ERROR = 2  # a bad command line or config: nothing ran


def _override_named(argv, error: str) -> str:
  """The --config.* argument the error message quotes, else the last one whose last field it
  names, or ""."""
  quoted = [arg for arg in argv[1:] if arg.startswith("--config.") and arg in error]
  if quoted:
    return quoted[-1]
  for arg in reversed(argv[1:]):
    if arg.startswith("--config.") and "=" in arg:
      field = arg[len("--"):].partition("=")[0]
      if re.search(rf"\b{re.escape(field.rsplit('.', 1)[-1])}\b", error):
        return arg
  return ""


def describe_flag_error(argv, error: Exception) -> str:
  """One line for a failed parse of `argv`."""
  text = " ".join(str(error).replace("\\n", " ").replace("\\'", "'").split())
  quoted = len(text) > 1 and text[0] == text[-1] and text[0] in "'\""
  if isinstance(error, (AttributeError, KeyError)) and quoted:
    text = text[1:-1]  # the quotes of a KeyError's repr
  arg = _override_named(argv, text)
  if isinstance(error, (AttributeError, KeyError)) and arg:
    field = arg[len("--"):].partition("=")[0]
    hint = re.search(r'Did you mean "([^"]+)"', text)
    return (f"{arg}: the config has no field {field}"
            + (f' (did you mean "{hint.group(1)}"?)' if hint else ""))
  return f"{arg}: {text}" if arg and arg not in text else text


def parse_flags(argv):
  """absl's flag parsing (`flags.FLAGS(argv)`), with a bad flag or override printed as
  `error: ...` on one line and exit status 2."""
  try:
    return flags.FLAGS(argv)
  except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as e:
    print(f"error: {describe_flag_error(argv, e)}", file=sys.stderr)
    sys.exit(USAGE_ERROR)
