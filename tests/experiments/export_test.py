"""experiments/export.py: a trained workdir out as an HF folder or PEFT adapters, and bad input.

Two toy runs of one RL step each: full fine-tuning of the tiny model, then LoRA on the first run's
HF export as a pretrained `model.source`. The exports are loaded by transformers (marked
`interop`) and by `load_pretrained`, and their logits compared with the restored checkpoint's.
"""

import json
import os
import shutil
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from configs import toy
from experiments import export
from rl_curriculum.model import pretrained, transformer
from rl_curriculum.train import loop
from rl_curriculum.train.setup import prepare as prepare_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOL = dict(atol=1e-4, rtol=0)


def _tiny_config(**model):
  """The toy run cut to one RL step on two bins; a large learning rate so that one step moves
  the weights (and LoRA's B away from 0) visibly."""
  c = toy.get_config()
  c.task.train_bins = (0, 1)
  c.task.eval_bins = (0,)
  c.task.train_per_bin = 8
  c.task.sft_per_bin = 8
  c.task.eval_per_bin = 2
  c.sft.steps = 2
  c.sft.batch_size = 4
  c.rl.steps = 1
  c.rl.prompts_per_step = 2
  c.rl.group_size = 2
  c.rl.max_new_tokens = 2
  c.rl.learning_rate = 1e-2
  for key, value in model.items():
    c.model[key] = value
  if c.model.source:
    c.sft.steps = 0  # pretrained models start without the warm start
  return c


def _tokens(vocab_size):
  return np.random.default_rng(0).integers(3, vocab_size, size=(3, 7)).astype(np.int32)


def _our_logits(workdir, tokens):
  """Logits of the newest checkpoint, restored through the trainer's own functions."""
  config = export.read_run_config(workdir)
  run = prepare_lib.prepare(config, workdir, log=lambda _: None)
  step, params = loop.restore_params(config, run, workdir)
  assert step == 1
  mask = jnp.ones(tokens.shape, bool)
  return np.asarray(transformer.forward(run.model.graphdef, params, jnp.asarray(tokens), mask))


def _transformers_logits(folder, tokens):
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
  with torch.no_grad():
    return model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("full"))
  loop.train_and_evaluate(_tiny_config(), workdir)
  return workdir


@pytest.fixture(scope="module")
def full_export(full_run, tmp_path_factory):
  """The full run exported by the command itself (a subprocess, as a user runs it)."""
  out = str(tmp_path_factory.mktemp("exports") / "full_hf")
  done = subprocess.run([sys.executable, "-m", "experiments.export", "--workdir", full_run,
                         "--out", out], capture_output=True, text=True, timeout=600, cwd=ROOT,
                        check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "exported step 1" in done.stdout
  return out


@pytest.fixture(scope="module")
def lora_run(full_export, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("lora"))
  loop.train_and_evaluate(_tiny_config(source=full_export, lora_rank=4,
                                       lora_targets=("q", "o", "down")), workdir)
  return workdir


@pytest.mark.slow
def test_hf_export_holds_the_run_and_reloads_here(full_run, full_export):
  assert {"config.json", "generation_config.json", "model.safetensors",
          "tokenizer.model"} <= set(os.listdir(full_export))
  policy = pretrained.load_pretrained(full_export)
  tokens = _tokens(policy.config.vocab_size)
  np.testing.assert_allclose(np.asarray(policy.logits(tokens)), _our_logits(full_run, tokens),
                             **TOL)


@pytest.mark.slow
@pytest.mark.interop
def test_hf_export_matches_transformers(full_run, full_export):
  with open(os.path.join(full_export, "config.json")) as f:
    tokens = _tokens(json.load(f)["vocab_size"])
  ours = _our_logits(full_run, tokens)
  assert np.abs(ours).max() > 1.0  # not a near-zero function
  np.testing.assert_allclose(_transformers_logits(full_export, tokens), ours, **TOL)


@pytest.mark.slow
@pytest.mark.interop
def test_lora_run_merged_export_matches_transformers(lora_run, full_export, tmp_path):
  out = str(tmp_path / "merged")
  result = export.export(lora_run, out, "hf", log=lambda _: None)
  assert result["step"] == 1 and "model.safetensors" in result["files"]
  base = pretrained.load_pretrained(full_export)
  tokens = _tokens(base.config.vocab_size)
  ours = _our_logits(lora_run, tokens)
  # The adapters moved: the merged model is not the base.
  assert np.abs(ours - np.asarray(base.logits(tokens))).max() > 1e-3
  np.testing.assert_allclose(_transformers_logits(out, tokens), ours, **TOL)


@pytest.mark.slow
def test_lora_run_peft_export_attaches_to_its_base(lora_run, full_export, tmp_path):
  out = str(tmp_path / "adapter")
  result = export.export(lora_run, out, "peft", log=lambda _: None)
  assert set(result["files"]) == {"adapter_config.json", "adapter_model.safetensors"}
  with open(os.path.join(out, "adapter_config.json")) as f:
    adapter = json.load(f)
  assert adapter["base_model_name_or_path"] == os.path.abspath(full_export)
  assert (adapter["r"], adapter["lora_alpha"]) == (4, 16.0)
  assert sorted(adapter["target_modules"]) == ["down_proj", "o_proj", "q_proj"]
  base = pretrained.load_pretrained(full_export)
  tokens = _tokens(base.config.vocab_size)
  ours = _our_logits(lora_run, tokens)
  assert np.abs(ours - np.asarray(base.logits(tokens))).max() > 1e-3  # the adapters matter
  try:
    import peft  # pylint: disable=import-outside-toplevel
  except ImportError:
    peft = None
  if peft is None:  # our own reader of PEFT folders
    attached = pretrained.load_pretrained(full_export, lora=out)
    theirs = np.asarray(attached.logits(tokens))
  else:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(full_export, dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(model, out).eval()
    with torch.no_grad():
      theirs = model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(theirs, ours, **TOL)


# --- bad input ------------------------------------------------------------------------------------


def _config_only_workdir(tmp_path, **model):
  """A workdir holding nothing but a run's config.json."""
  workdir = tmp_path / "config_only"
  workdir.mkdir()
  (workdir / "config.json").write_text(_tiny_config(**model).to_json())
  return str(workdir)


def test_missing_workdir_and_config(tmp_path):
  with pytest.raises(export.ExportError, match="no workdir"):
    export.export(str(tmp_path / "nowhere"), str(tmp_path / "out"))
  with pytest.raises(export.ExportError, match="no config.json"):
    export.export(str(tmp_path), str(tmp_path / "out"))


def test_workdir_without_checkpoint(tmp_path):
  workdir = _config_only_workdir(tmp_path)
  with pytest.raises(export.ExportError, match="no RL checkpoint"):
    export.export(workdir, str(tmp_path / "out"))
  assert not os.path.exists(tmp_path / "out")


def test_peft_needs_adapters_and_a_pretrained_base(tmp_path):
  with pytest.raises(export.ExportError, match="lora_rank = 0"):
    export.export(_config_only_workdir(tmp_path), str(tmp_path / "out"), "peft")
  shutil.rmtree(tmp_path / "config_only")
  with pytest.raises(export.ExportError, match="pretrained base"):
    export.export(_config_only_workdir(tmp_path, lora_rank=4), str(tmp_path / "out"), "peft")
  shutil.rmtree(tmp_path / "config_only")
  # Adapters merged into the base during training (ReLoRA) no longer fit model.source.
  with pytest.raises(export.ExportError, match="lora_merge_every = 2"):
    export.export(_config_only_workdir(tmp_path, lora_rank=4, lora_merge_every=2),
                  str(tmp_path / "out"), "peft")


@pytest.mark.slow
def test_missing_caches_and_a_used_output_folder(full_run, tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(full_run, workdir)
  used = tmp_path / "used"
  used.mkdir()
  (used / "file").write_text("")
  with pytest.raises(export.ExportError, match="not an empty folder"):
    export.export(workdir, str(used))
  shutil.rmtree(os.path.join(workdir, "sft"))
  with pytest.raises(export.ExportError, match="SFT warm start"):
    export.export(workdir, str(tmp_path / "out"))
  os.remove(os.path.join(workdir, "tokenizer.model"))
  with pytest.raises(export.ExportError, match="tokenizer.model"):
    export.export(workdir, str(tmp_path / "out"))


@pytest.mark.slow
def test_command_exits_with_status_2_and_one_line(full_run, tmp_path):
  done = subprocess.run([sys.executable, "-m", "experiments.export", "--workdir", full_run,
                         "--out", str(tmp_path / "out"), "--format", "peft"],
                        capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)
  assert done.returncode == 2, done.stderr[-3000:]
  assert "Traceback" not in done.stderr
  assert done.stderr.strip().splitlines()[-1].startswith("error: --format peft needs a LoRA run")
