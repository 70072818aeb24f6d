"""Hub layers: drop-in forwards for kernelize(). They keep no state of their
own and read the replaced module's ``weight`` and ``variance_epsilon``."""
import torch
from torch import nn

from .. import _rms_norm, rms_norm


class RMSNorm(nn.Module):
    """Forward of transformers' LlamaRMSNorm (and its Mistral/Qwen2 twins)."""

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling() or (
                torch.is_grad_enabled() and (hidden_states.requires_grad or self.weight.requires_grad)):
            # the operator: one opaque node under torch.compile, and its autograd formula
            return rms_norm(hidden_states, self.weight, self.variance_epsilon)
        # inference in eager mode: the kernel itself, without the custom-op dispatch
        # (which costs about as much as the kernel on a decode step's [1, hidden] rows)
        return _rms_norm(hidden_states, self.weight, self.variance_epsilon)


LlamaRMSNorm = RMSNorm

__all__ = ["RMSNorm", "LlamaRMSNorm"]
