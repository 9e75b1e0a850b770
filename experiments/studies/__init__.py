"""Studies: experiments that compare curricula or probe the trainer, each run from the repository
root as `python -m experiments.studies.NAME`. Their committed results are in benchmarks/results/.

  compare_curricula  curricula compared in RL on equal rollout budgets, several seeds each
                     (OUT/curricula_NAME.{json,md,png})
  comparison_stats   its statistics: intervals, curve areas, crossings (imported, not run)
  comparison_report  its report: the markdown and the plot (imported, not run)
  curriculum_gym     every curriculum on the simulated learner (curriculum_gym*.{json,md,png})
  admission_bias     the arms trained against those selected when late groups are dropped
                     (admission_bias.{json,md})
  faults             faults injected into a toy run, and whether its workdir held
                     (faults.{json,md})
"""
