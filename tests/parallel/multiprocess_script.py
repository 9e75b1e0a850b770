"""One process of a toy quickstart run; run by multiprocess_test.py (one or two at a time).

  XLA_FLAGS=--xla_force_host_platform_device_count=4 python multiprocess_script.py WORKDIR \
      STEPS NUM_PROCESSES PROCESS_ID PORT

With NUM_PROCESSES = 1 the run is a plain single-process run on the visible devices. The mesh is
(2, 4, 1): data parallelism across the two processes' halves, FSDP within each.
"""

import sys

from configs import quickstart
from rl_curriculum.train import loop


def toy_config(steps: int, num_processes: int, process_id: int, port: int):
  c = quickstart.get_config()
  c.task.train_bins = (0, 1, 2)
  c.task.eval_bins = (0, 2, 8)
  c.task.train_per_bin = 40
  c.task.sft_per_bin = 40
  c.task.eval_per_bin = 8
  c.sft.steps = 10
  c.sft.batch_size = 16
  c.rl.steps = steps
  c.rl.prompts_per_step = 4
  c.rl.group_size = 4
  c.rl.max_new_tokens = 4
  c.eval.every = 2
  c.eval.batch_size = 8
  c.checkpoint.every = 1
  c.checkpoint.keep = 100          # every step's state stays on disk for the comparison
  c.parallel.mesh_shape = (2, 4, 1)
  c.parallel.check_replicated = True
  if num_processes > 1:
    c.parallel.coordinator_address = f"127.0.0.1:{port}"
    c.parallel.num_processes = num_processes
    c.parallel.process_id = process_id
  return c


if __name__ == "__main__":
  workdir, steps, num_processes, process_id, port = sys.argv[1], *map(int, sys.argv[2:6])
  summary = loop.train_and_evaluate(toy_config(steps, num_processes, process_id, port), workdir)
  print("SUMMARY", summary, flush=True)
