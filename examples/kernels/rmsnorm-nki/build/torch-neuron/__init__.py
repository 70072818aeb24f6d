"""RMSNorm for Llama-family decoders as an NKI kernel (torch-neuronx).

``rms_norm(x, weight, eps)`` normalises over the last dimension like
transformers' LlamaRMSNorm: fp32 statistics, the normalised activations
rounded to the input dtype, then scaled by the weight.
"""
import torch

import nki
import nki.isa as nisa
import nki.language as nl
from torch_neuronx import nki_op

from ._ops import add_op_namespace_prefix, ops

__all__ = ["rms_norm", "rms_norm_kernel", "layers", "ops"]


@nki.jit
def rms_norm_kernel(x, w, eps):
    """x: [N, H], w: [H]; returns [N, H]. 128 rows per tile (the last tile
    may be partial); the weight is DMA-broadcast to all partitions once."""
    N, H = x.shape
    P = nl.tile_size.pmax
    out_dtype = x.dtype if w.dtype == x.dtype else nl.float32
    out = nl.ndarray((N, H), dtype=out_dtype, buffer=nl.shared_hbm)
    weight = nl.ndarray((P, H), dtype=w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=weight, src=w.reshape((1, H)).broadcast(0, P))
    for i in nl.affine_range((N + P - 1) // P):
        # tiles of exactly the rows this step has: a partly written tile would be
        # NaN-filled first on the native executor (its fresh-buffer sentinel), which
        # costs more than the whole kernel for a decode step's single row
        p = min(P, N - i * P)
        rows = nl.ds(i * P, p)
        t = nl.ndarray((p, H), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[rows])
        squares = nl.ndarray((p, H), dtype=nl.float32, buffer=nl.sbuf)
        ssum = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(dst=squares, op=nl.square, data=t, reduce_op=nl.add, reduce_res=ssum)
        rstd = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
        # mean = sum / H (a division, as torch's mean), then + eps and rsqrt
        nisa.tensor_scalar(dst=rstd, data=ssum, op0=nl.divide, operand0=float(H), op1=nl.add, operand1=eps)
        nisa.activation(dst=rstd, op=nl.rsqrt, data=rstd)
        normed = nl.ndarray((p, H), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=normed, data=t, op0=nl.multiply, operand0=rstd)
        y = nl.ndarray((p, H), dtype=out_dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=y, data1=weight[:p], data2=normed, op=nl.multiply)
        nisa.dma_copy(dst=out[rows], src=y)
    return out


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    shape = x.shape
    y = rms_norm_kernel(x.reshape(-1, shape[-1]).contiguous(), weight.contiguous(), eps)
    return y.reshape(shape)


if hasattr(ops, "rms_norm"):  # this kernel version is already loaded
    rms_norm = ops.rms_norm
else:
    rms_norm = nki_op(add_op_namespace_prefix("rms_norm"), _rms_norm, mutates_args=())

    def _setup(ctx, inputs, output):
        x, weight, eps = inputs
        ctx.save_for_backward(x, weight)
        ctx.eps = eps

    def _backward(ctx, grad):
        x, weight = ctx.saved_tensors
        xf, gf = x.float(), grad.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + ctx.eps)
        xhat = xf * rstd
        gw = gf * weight.float()
        dx = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
        dweight = (gf * xhat).reshape(-1, x.shape[-1]).sum(0)
        return dx.to(x.dtype), dweight.to(weight.dtype), None

    rms_norm.register_autograd(_backward, setup_context=_setup)

from . import layers  # noqa: E402
