"""What makes a run survive: checkpoints, the workdir, recovery.

  checkpointing  sealed checkpoints, verified on restore, the newest intact one
  workdir        one writer per workdir; the config its checkpoints were made with
  recovery       rollback to the last healthy checkpoint after skipped updates or a collapse
  collapse       the signs of a collapsed policy
"""
