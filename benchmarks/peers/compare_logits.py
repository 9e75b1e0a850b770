"""Checks that the Tunix peer computes the same logits as transformers on a checkpoint folder.

Run in the project's .venv (it has transformers and torch; .venv-tunix has no torch):

  python benchmarks/peers/compare_logits.py --model-dir DIR [--tunix-python .venv-tunix/bin/python]

It runs `tunix_peer.py --logits-out` in the Tunix environment (with and without the rope_theta
fix, see tunix_peer.py), computes transformers' LlamaForCausalLM float32 logits of the same
prompt, and prints max |tunix - transformers| for both as JSON. Exit status 1 when the fixed
peer's difference exceeds --tol.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def tunix_logits(python, model_dir, prompt, rope_fix):
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "logits.npy")
    cmd = [python, os.path.join(HERE, "tunix_peer.py"), "--model-dir", model_dir,
           "--logits-out", path, "--logits-prompt", prompt]
    if not rope_fix:
      cmd.append("--no-rope-fix")
    subprocess.run(cmd, check=True)
    return np.load(path)


def transformers_logits(model_dir, prompt):
  import torch
  import transformers

  torch.set_num_threads(len(os.sched_getaffinity(0)))
  model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
  model.eval()
  ids = torch.tensor([[int(t) for t in prompt.split(",")]])
  with torch.no_grad():
    return model(ids).logits.numpy().astype(np.float32)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--model-dir", required=True)
  p.add_argument("--tunix-python", default=os.path.join(ROOT, ".venv-tunix", "bin", "python"))
  p.add_argument("--prompt", default="3,17,42,5,9,11,30,2,8,61")
  p.add_argument("--tol", type=float, default=1e-3)
  args = p.parse_args(argv)
  reference = transformers_logits(args.model_dir, args.prompt)
  report = {"model_dir": args.model_dir, "prompt": args.prompt,
            "logit_scale": float(np.abs(reference).max())}
  for name, fix in (("max_abs_diff", True), ("max_abs_diff_without_rope_fix", False)):
    ours = tunix_logits(args.tunix_python, args.model_dir, args.prompt, fix)
    if ours.shape != reference.shape:
      raise ValueError(f"shapes differ: tunix {ours.shape}, transformers {reference.shape}")
    report[name] = float(np.abs(ours - reference).max())
    report[name.replace("max_abs_diff", "argmax_agreement")] = float(
        (ours.argmax(-1) == reference.argmax(-1)).mean())
  print(json.dumps(report, indent=2))
  return 0 if report["max_abs_diff"] <= args.tol else 1


if __name__ == "__main__":
  sys.exit(main())
