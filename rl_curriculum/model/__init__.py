"""rl_curriculum.model: the policy transformer (config, Flax NNX modules) and LoRA adapters.

  from rl_curriculum.model import ModelConfig, transformer, lora
"""

from rl_curriculum.model import lora
from rl_curriculum.model import transformer
from rl_curriculum.model.config import ModelConfig
from rl_curriculum.model.config import PRESETS
from rl_curriculum.model.lora import LoRAConfig
from rl_curriculum.model.transformer import Transformer
