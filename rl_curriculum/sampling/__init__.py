"""rl_curriculum.sampling: the jitted KV-cache sampler and its token-selection strategies."""

from rl_curriculum.sampling import strategies
from rl_curriculum.sampling.sampler import decode
from rl_curriculum.sampling.sampler import prefill
from rl_curriculum.sampling.sampler import sample
from rl_curriculum.sampling.sampler import SamplingState

__all__ = ["SamplingState", "decode", "prefill", "sample", "strategies"]
