"""One process of a toy run; run by multiprocess_test.py (one or two at a time).

  XLA_FLAGS=--xla_force_host_platform_device_count=4 python multiprocess_script.py WORKDIR \
      STEPS NUM_PROCESSES PROCESS_ID PORT

With NUM_PROCESSES = 1 the run is a plain single-process run on the visible devices. The mesh is
(2, 4, 1): data parallelism across the two processes' halves, FSDP within each.
"""

import sys

from configs import toy
from rl_curriculum.train import loop


def toy_config(steps: int, num_processes: int, process_id: int, port: int):
  c = toy.get_config()
  c.rl.steps = steps
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
