"""What a run reports: held-out evaluation, paired comparisons, metrics, the summary and figures.

  evaluation  greedy held-out accuracy per bin
  paired      intervals of a change paired per problem (and per seed)
  summary     evaluation metrics during a run, the summary and table at its end
  metrics     metrics.jsonl, TensorBoard event files, the console progress line
  figures     report.png and report.html
"""
