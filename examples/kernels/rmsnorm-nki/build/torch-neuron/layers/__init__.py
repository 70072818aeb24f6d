"""Hub layers: drop-in forwards for kernelize(). They keep no state of their
own and read the replaced module's ``weight`` and ``variance_epsilon``."""
import torch
from torch import nn

from .. import rms_norm


class RMSNorm(nn.Module):
    """Forward of transformers' LlamaRMSNorm (and its Mistral/Qwen2 twins)."""

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden_states, self.weight, self.variance_epsilon)


LlamaRMSNorm = RMSNorm

__all__ = ["RMSNorm", "LlamaRMSNorm"]
