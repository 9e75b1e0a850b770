"""A run's set-up: the config checked, data, tokenizer, model and SFT warm start.

  validation  the one check of a config (`ConfigError` naming the field, from errors)
  builders    config -> parts: task, curriculum, model shape, optimizer, LearnConfig
  prepare     phases 1-3 of a run: data, tokenizer, the warm-started policy
  data        problems per split, the curriculum's arms, token pools, the workdir's tokenizer
  warm_start  the cached SFT warm start, its fingerprint, LoRA attachment; sft its steps
  features    PCL's prompt features, refreshed as the policy changes
"""
