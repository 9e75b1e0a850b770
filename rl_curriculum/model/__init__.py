"""rl_curriculum.model: the policy transformer (config, Flax NNX modules) and LoRA adapters.

  from rl_curriculum.model import ModelConfig, transformer, lora
  policy = load_pretrained("smollm2-135m-instruct")   # or an HF folder, or a .gguf file
"""

from rl_curriculum.model import lora
from rl_curriculum.model import transformer
from rl_curriculum.model.config import ModelConfig
from rl_curriculum.model.config import PRESETS
from rl_curriculum.model.lora import LoRAConfig
from rl_curriculum.model.transformer import Transformer
from rl_curriculum.model.pretrained import Policy
from rl_curriculum.model.pretrained import load_pretrained
from rl_curriculum.model.pretrained import save_pretrained
