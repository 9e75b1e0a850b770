"""The Colab notebooks are committed with their outputs, and run top to bottom at a small size
saving real images.

Each notebook runs in a fresh kernel from the repository root with RLC_SMOKE=1 (every size shrunk)
and RLC_OUT pointing at a temporary folder; the figures it saves there must be non-empty PNGs with
more than one colour.
"""

import os

import numpy as np
import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
Image = pytest.importorskip("PIL.Image")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NOTEBOOKS = {
    "quickstart": ("quickstart_report.png", "quickstart_accuracy.png",
                   "quickstart_sec_probs.png"),
    "curriculum_playground": ("playground_learning_curves.png", "playground_arm_probs.png",
                              "playground_ladder.png"),
    "kernels": ("kernels_abs_advantage.png", "kernels_clipped_loss.png", "kernels_kl.png"),
}


def _read(name):
  return nbformat.read(os.path.join(ROOT, "colab", f"{name}.ipynb"), as_version=4)


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_is_committed_with_its_outputs_and_installs_in_colab(name):
  """Browsing a notebook shows its plots: it is committed as `python -m
  experiments.tools.notebooks` ran it, every code cell in order, none raising, with its figures as
  images."""
  nb = _read(name)
  nbformat.validate(nb)
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert "google.colab" in code[0].source and "pip" in code[0].source
  assert [c.get("execution_count") for c in code] == list(range(1, len(code) + 1)), (
      f"colab/{name}.ipynb is not committed as run top to bottom: "
      "python -m experiments.tools.notebooks")
  outputs = [o for c in code for o in c.get("outputs", [])]
  assert not [o for o in outputs if o.output_type == "error"]
  images = [o for o in outputs if "image/png" in o.get("data", {})]
  assert len(images) >= len(NOTEBOOKS[name]), (name, len(images))
  assert any("rl_curriculum" in c.source for c in code)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_runs(name, tmp_path, monkeypatch):
  out = tmp_path / "figures"
  monkeypatch.setenv("RLC_SMOKE", "1")
  monkeypatch.setenv("RLC_OUT", str(out))
  monkeypatch.setenv("RLC_WORKDIR", str(tmp_path / "workdir"))
  nb = _read(name)
  client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                   resources={"metadata": {"path": ROOT}})
  client.execute()
  for png in NOTEBOOKS[name]:
    path = out / png
    assert path.exists(), f"{name} did not save {png}"
    with Image.open(path) as img:
      assert img.format == "PNG"
      assert img.width > 100 and img.height > 100
      pixels = np.asarray(img.convert("RGB"))
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 10, f"{png} is blank"
