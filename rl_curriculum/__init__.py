"""rl_curriculum: RL post-training of language models with automatic curricula, in JAX.

Subpackages: `model` (policy transformer, LoRA), `sampling` (KV-cache sampler), `rl` (advantages,
losses, stability), `curriculum` (SEC and relatives), `tasks` (verifiable problems), `parallel`
(meshes and shardings), `train` (the experiment loop). Shared pytrees live in `types`.
"""

__version__ = "0.1.0"
