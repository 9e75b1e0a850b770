"""Sampling demo: the KV-cache sampler on the tiny transformer with random weights.

  python -m experiments.sample --config configs/sample.py

Builds the `tiny` preset over a byte-level vocabulary (256 bytes + pad, bos, eos; no tokenizer
needed), repeats the prompts below to fill `batch_size` rows, samples once to compile, then again
to time it. Prints the model size, the first `show_per_prompt` completions of each prompt (random
weights, so the bytes are noise: the pipeline is the point; undecodable bytes show as U+FFFD and
control characters as '.'), and a line `decode: N new tokens in S s = R tokens/s (batch B)`.
Takes about 10 s on a 2-core CPU, most of it compilation.

Overrides: --config.max_new_tokens=64 --config.greedy=True --config.top_p=0.9 ...
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0                    # model initialisation and sampling keys derive from it
  c.preset = "tiny"             # rl_curriculum.model.config.PRESETS name
  c.dtype = "float32"           # activations: float32 or bfloat16
  c.param_dtype = "float32"     # parameter storage: float32 or bfloat16
  c.prompts = ("The answer is", "2 + 3 =", "Once upon a time")  # texts to continue
  c.batch_size = 32             # rows sampled together (prompts repeated), as P * G in RL
  c.show_per_prompt = 2         # completions printed for each prompt
  c.max_new_tokens = 32         # N, tokens generated per row at most
  c.temperature = 1.0           # softmax temperature (ignored when greedy)
  c.top_k = 0                   # keep the k most likely tokens; 0 = off
  c.top_p = 1.0                 # nucleus mass; 1.0 = off
  c.greedy = False              # argmax decoding
  return c
