#!/usr/bin/env python3
"""Sweeps ATen for ops that other backends implement but the CPU lacks.

The neuron device runs every op without a kernel of its own through its CPU
kernel (csrc/aten/HostExecution.cpp). An op with kernels only for
accelerators (CUDA, XPU, MPS, ...) and no CPU or composite kernel therefore
fails on neuron unless we register a neuron kernel for it. This tool lists
every such overload and what we decided for it:

    implemented   a neuron kernel exists (the sweep verifies it is registered)
    skipped       not reachable on neuron, or deliberately left out (reason given)
    UNCLASSIFIED  new in this torch: decide, then add it to DECISIONS below

    python tools/sweep_accelerator_only_ops.py             # table on stdout
    python tools/sweep_accelerator_only_ops.py --markdown  # the docs/ops.md section
    python tools/sweep_accelerator_only_ops.py --check     # exit 1 on UNCLASSIFIED / missing kernels

Declared dispatch keys come from native_functions.yaml (shipped with
torchgen); whether a CPU or composite kernel exists comes from the live
dispatcher, so ops registered from Python count too.
"""
import argparse
import dataclasses
import pathlib
import sys

import torch
import torchgen
import yaml

# Kernels that make an op run on neuron without anything from us.
HOST_KEYS = ("CPU", "CompositeImplicitAutograd", "CompositeExplicitAutograd",
             "CompositeExplicitAutogradNonFunctional")

# Dispatch keys of tensor kinds neuron does not have (neuron tensors are dense
# and strided): an op declared only for these cannot see a neuron tensor.
_OTHER_LAYOUT_PREFIXES = ("Sparse", "Quantized", "NestedTensor", "Mkldnn")

IMPLEMENTED = "implemented"
SKIPPED = "skipped"
UNCLASSIFIED = "UNCLASSIFIED"

# Ops with neuron kernels, by the file that registers them.
_IMPLEMENTED = {
    "csrc/aten/NativeOps.cpp": ["_copy_from", "_copy_from_and_resize", "record_stream"],
    "csrc/aten/SyncBatchNorm.cpp": ["batch_norm_stats", "batch_norm_elemt", "batch_norm_gather_stats",
                                    "batch_norm_gather_stats_with_counts", "batch_norm_backward_reduce",
                                    "batch_norm_backward_elemt"],
    "csrc/aten/RecurrentCells.cpp": ["_thnn_fused_lstm_cell", "_thnn_fused_lstm_cell_backward_impl",
                                     "_thnn_fused_gru_cell", "_thnn_fused_gru_cell_backward"],
    "csrc/aten/Attention.cpp": ["_scaled_dot_product_flash_attention",
                                "_scaled_dot_product_flash_attention_backward"],
    "csrc/aten/AcceleratorOnlyOps.cpp": [
        "batch_norm_elemt.out", "linear_backward", "mm.dtype", "mm.dtype_out", "bmm.dtype", "bmm.dtype_out",
        "addmm.dtype", "addmm.dtype_out", "baddbmm.dtype", "baddbmm.dtype_out", "_fused_rms_norm_backward",
        "_masked_scale", "_fused_dropout", "max_pool2d_backward", "_conv_depthwise2d", "_conv_depthwise2d.out",
        "conv_depthwise3d"],
    "csrc/aten/AttentionKernels.cpp": [
        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
        "_flash_attention_forward", "_flash_attention_backward", "_efficient_attention_forward",
        "_efficient_attention_backward"],
}

# Deliberate skips: overload or base name -> reason.
_SKIPPED = {
    # Backend libraries' own entry points: the dispatch never selects them for
    # a neuron tensor (SDPA, convolution, RNNs and CTC loss choose the neuron
    # paths above), and their arguments are library-specific.
    "_use_cudnn_ctc_loss": "cuDNN query", "_cudnn_ctc_loss": "cuDNN kernel", "_cudnn_rnn": "cuDNN kernel",
    "_cudnn_rnn_backward": "cuDNN kernel", "_cudnn_rnn_flatten_weight": "cuDNN weight layout",
    "_cudnn_init_dropout_state": "cuDNN dropout state", "_cudnn_attention_forward": "cuDNN kernel",
    "_cudnn_attention_backward": "cuDNN kernel", "_scaled_dot_product_cudnn_attention": "cuDNN kernel",
    "_scaled_dot_product_cudnn_attention_backward": "cuDNN kernel",
    "_use_miopen_ctc_loss": "MIOpen query", "_mps_convolution": "MPS kernel",
    "mps_convolution_backward": "MPS kernel", "_mps_convolution_transpose": "MPS kernel",
    "mps_convolution_transpose_backward": "MPS kernel", "_lstm_mps": "MPS kernel", "lstm_mps_backward": "MPS kernel",
    "_scaled_dot_product_attention_math_for_mps": "MPS kernel",
    "_triton_scaled_dot_attention": "CUDA Triton prototype", "_triton_multi_head_attention": "CUDA Triton prototype",
    "_fill_mem_eff_dropout_mask_": "CUDA memory-efficient attention's dropout mask (test helper; neuron "
                                   "attention has no fused dropout)",
    # Weight formats of particular GPU kernels.
    "_cslt_compress": "cuSPARSELt 2:4 format", "_cslt_sparse_mm": "cuSPARSELt 2:4 format",
    "_cslt_sparse_mm_search": "cuSPARSELt 2:4 format", "_to_sparse_semi_structured": "CUTLASS 2:4 format",
    "_sparse_semi_structured_tile": "CUTLASS 2:4 format", "_sparse_semi_structured_apply": "CUTLASS 2:4 format",
    "_sparse_semi_structured_apply_dense": "CUTLASS 2:4 format",
    "_sparse_semi_structured_linear": "CUTLASS 2:4 format", "_sparse_semi_structured_mm": "CUTLASS 2:4 format",
    "_sparse_semi_structured_addmm": "CUTLASS 2:4 format",
    "_mixed_dtypes_linear": "CUTLASS-preprocessed int8/int4 weights",
    "_convert_weight_to_int4pack": "CUDA tensor-core int4 layout (the meta kernel promises it); the host layout's "
                                   "_convert_weight_to_int4pack_for_cpu / _weight_int4pack_mm_for_cpu run on neuron",
    "_weight_int4pack_mm": "CUDA tensor-core int4 layout; use _weight_int4pack_mm_for_cpu",
    "_weight_int4pack_mm_with_scales_and_zeros": "XPU int4 layout; use _weight_int4pack_mm_for_cpu",
    "_scaled_grouped_mm": "FP8 scaled GEMM of Hopper-class GPUs", "_scaled_grouped_mm_v2": "FP8 scaled GEMM",
    "_flash_attention_forward.quantized": "FP8 flash attention",
    "_scaled_dot_product_flash_attention.quantized": "FP8 flash attention",
    # Reachable, deliberately left out for now.
    "_philox_key_split": "experimental torch.func._random keys: their streams must match CUDA's bit for bit; "
                         "not implemented yet",
    "_philox_key_fold_in": "experimental torch.func._random (see _philox_key_split)",
    "_philox_normal_": "experimental torch.func._random (see _philox_key_split)",
    "_philox_uniform_": "experimental torch.func._random (see _philox_key_split)",
    "_flash_attention_forward_no_dropout_inplace": "varlen_attn_out's in-place flash variant; not implemented yet "
                                                   "(varlen_attn works)",
    # Not accelerator ops at all.
    "_resize_output_": "Meta-only helper of tracing; no device has a kernel",
}


def _decision_table():
    table = {}
    for path, names in _IMPLEMENTED.items():
        for name in names:
            table[name] = (IMPLEMENTED, path)
    for name, reason in _SKIPPED.items():
        table[name] = (SKIPPED, reason)
    return table


DECISIONS = _decision_table()


@dataclasses.dataclass
class Entry:
    op: str          # overload name, e.g. "mm.dtype"
    keys: list       # dispatch keys native_functions.yaml declares
    decision: str
    detail: str      # file of the neuron kernel, or the reason for skipping
    has_neuron_kernel: bool


def _declared_functions():
    path = pathlib.Path(torchgen.__file__).parent / "packaged" / "ATen" / "native" / "native_functions.yaml"
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for fn in yaml.load(path.read_text(), Loader=loader):
        name = fn["func"].split("(")[0]
        keys = set()
        for k in (fn.get("dispatch") or {}):
            keys.update(s.strip() for s in k.split(","))
        yield name, sorted(keys)


def _has(op, key):
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", key)


def sweep():
    """Every ATen overload without a CPU or composite kernel, with its decision."""
    entries = []
    for op, keys in _declared_functions():
        if any(_has(op, k) for k in HOST_KEYS):
            continue
        base = op.split(".")[0]
        neuron = _has(op, "PrivateUse1")
        if op in DECISIONS or base in DECISIONS:
            decision, detail = DECISIONS.get(op) or DECISIONS[base]
        elif keys and all(k.startswith(_OTHER_LAYOUT_PREFIXES) or k.endswith("Meta") for k in keys):
            decision, detail = SKIPPED, "sparse/quantized/nested/mkldnn tensors only; neuron tensors are dense"
        elif not keys:
            decision, detail = SKIPPED, "no kernel for any device (Python-level nested-jagged op)"
        elif "cudnn" in op or "miopen" in op or "mkldnn" in op:
            decision, detail = SKIPPED, "backend library entry point"
        else:
            decision, detail = UNCLASSIFIED, ""
        entries.append(Entry(op, keys, decision, detail, neuron))
    return entries


def problems(entries):
    """What makes the classification untrue: undecided ops, decided-as-implemented ops without a neuron
    kernel, decisions for ops that no longer exist or gained a host kernel."""
    out = []
    for e in entries:
        if e.decision == UNCLASSIFIED:
            out.append(f"{e.op} ({', '.join(e.keys)}): accelerator-only and unclassified")
        elif e.decision == IMPLEMENTED and not e.has_neuron_kernel:
            out.append(f"{e.op}: listed as implemented in {e.detail} but has no neuron kernel")
    swept = {e.op for e in entries} | {e.op.split(".")[0] for e in entries}
    for name in DECISIONS:
        if name not in swept:
            out.append(f"{name}: decided, but no longer an accelerator-only op (stale entry)")
    return out


def render_markdown(entries):
    implemented = [e for e in entries if e.decision == IMPLEMENTED]
    skipped = [e for e in entries if e.decision != IMPLEMENTED]
    lines = [
        "## Ops other backends implement that the CPU lacks",
        "",
        "Generated by `python tools/sweep_accelerator_only_ops.py --markdown`: the ATen overloads with kernels "
        "only for accelerators (no CPU, no composite kernel), which the host fallback cannot run. "
        f"{len(entries)} overloads: {len(implemented)} have neuron kernels, {len(skipped)} are skipped "
        "(the neuron dispatch never reaches them, or deliberately, with the reason). "
        "`tests/test_accelerator_only_ops.py` fails when a new one appears undecided.",
        "",
        "| op | declared for | neuron kernel |",
        "|---|---|---|",
    ]
    for e in implemented:
        lines.append(f"| `{e.op}` | {', '.join(e.keys)} | `{e.detail}` |")
    lines += ["", "Skipped:", "", "| op | declared for | why |", "|---|---|---|"]
    for e in skipped:
        lines.append(f"| `{e.op}` | {', '.join(e.keys) or '-'} | {e.detail or e.decision} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--markdown", action="store_true", help="print the docs/ops.md section")
    ap.add_argument("--check", action="store_true", help="exit 1 if the classification is not true")
    args = ap.parse_args()
    import torch_neuronx  # noqa: F401  (registers the neuron kernels the sweep checks for)

    entries = sweep()
    if args.markdown:
        print(render_markdown(entries), end="")
    else:
        for e in entries:
            mark = "neuron" if e.has_neuron_kernel else "-"
            print(f"{e.decision:12} {mark:6} {e.op:55} {','.join(e.keys):40} {e.detail}")
    bad = problems(entries)
    for p in bad:
        print("error:", p, file=sys.stderr)
    return 1 if (args.check and bad) else 0


if __name__ == "__main__":
    sys.exit(main())
