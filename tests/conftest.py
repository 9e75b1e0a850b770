"""Test set-up shared by the whole suite."""

import jax

# Implicit rank promotion hides shape bugs; every kernel must be explicit about broadcasting.
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_default_matmul_precision", "highest")
