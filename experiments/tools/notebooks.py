"""Runs the Colab notebooks top to bottom at full size and saves them with their outputs.

  python -m experiments.tools.notebooks [--names=quickstart,kernels] [--workdir=workdirs/notebooks]

Each notebook in colab/ runs in a fresh kernel from the repository root (RLC_SMOKE unset, so at
the sizes a reader would use), its figures and run folders under --workdir, and is written back
with every cell's output, so that browsing it shows the plots and tables. A notebook whose cell
raises is not written back. The quickstart notebook trains its run (about 5 minutes on 2 cores);
the others take a minute or two.
"""

import os
import time

from absl import app
from absl import flags

FLAGS = flags.FLAGS

NAMES = ("kernels", "curriculum_playground", "quickstart")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_notebook(name: str, workdir: str) -> float:
  """Executes colab/NAME.ipynb in place with its outputs; returns the seconds it took."""
  import nbclient  # pylint: disable=import-outside-toplevel
  import nbformat  # pylint: disable=import-outside-toplevel
  path = os.path.join(ROOT, "colab", f"{name}.ipynb")
  nb = nbformat.read(path, as_version=4)
  folder = os.path.abspath(os.path.join(workdir, name))
  env = {"RLC_OUT": os.path.join(folder, "figures"), "RLC_WORKDIR": os.path.join(folder, "run")}
  saved = {k: os.environ.get(k) for k in (*env, "RLC_SMOKE")}
  os.environ.update(env)
  os.environ.pop("RLC_SMOKE", None)
  start = time.perf_counter()
  try:
    nbclient.NotebookClient(nb, timeout=3600, kernel_name="python3",
                            resources={"metadata": {"path": ROOT}}).execute()
  finally:
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v
  nbformat.write(nb, path)
  return time.perf_counter() - start


def define_flags() -> None:
  """The command's flags; defined when it runs, so that importing this module defines none."""
  flags.DEFINE_list("names", list(NAMES), "Notebooks of colab/ to run.")
  flags.DEFINE_string("workdir", "workdirs/notebooks",
                      "Folder of the notebooks' figures and run folders.")


def main(argv):
  del argv
  for name in FLAGS.names:
    if name not in NAMES:
      raise app.UsageError(f"--names: {name!r} is not one of {', '.join(NAMES)}")
  for name in FLAGS.names:
    print(f"colab/{name}.ipynb: {run_notebook(name, FLAGS.workdir):.0f} s", flush=True)


if __name__ == "__main__":
  define_flags()
  app.run(main)
