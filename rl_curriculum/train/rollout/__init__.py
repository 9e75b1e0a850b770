"""The host side of rollouts: what a step samples, how it is scored, the batch the learn step
takes.

  pipeline  the one rollout path: queue a batch k steps ahead, finish and score it, decode while
            the step learns (k = 0: the synchronous run)
  batch     where a step's rows live, scoring on the host, the one `Batch` builder
  budget    completion slots per prompt (allocations, skipped prompts) and per-prompt statistics
  checks    the rollout side of a config (engine, slots, rollouts in flight, device split)
"""
