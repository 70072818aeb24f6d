"""Target NeuronCore generation and its tile limits.

The target comes from ``NEURON_PLATFORM_TARGET_OVERRIDE`` (``trn1``/``gen2``,
``trn2``/``gen3``, ``trn3``/``gen4``); like the vendor's simulator without
hardware we need a default, and we pick trn2. It is read at each kernel
launch, so tests can switch it per call.
"""
import os

from ._errors import NKIError

_ALIASES = {"trn1": "trn1", "gen2": "trn1", "inf2": "trn1",
            "trn2": "trn2", "gen3": "trn2",
            "trn3": "trn3", "gen4": "trn3"}

# Per-partition SBUF bytes by generation.
_SBUF_PARTITION_BYTES = {"trn1": 192 * 1024, "trn2": 224 * 1024, "trn3": 256 * 1024}


def current():
    raw = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE", "").strip().lower()
    if not raw:
        return "trn2"
    if raw not in _ALIASES:
        raise NKIError(f"NEURON_PLATFORM_TARGET_OVERRIDE={raw!r} is not a known target "
                       f"(expected one of {sorted(_ALIASES)})")
    return _ALIASES[raw]


PMAX = 128
PSUM_BANK_BYTES = 2048
PSUM_BANKS = 8
GEMM_STATIONARY_FMAX = 128
BN_STATS_FMAX = 512
SBUF_FREE_ELEMS = 64 * 1024
PSUM_FREE_ELEMS = 4 * 1024


def gemm_moving_fmax(dst_itemsize=4, target=None):
    """Moving free-size limit of nc_matmul: 512 up to trn2; trn3 streams
    4096 columns into an fp32 PSUM tile and 8192 into a bf16 one."""
    if (target or current()) == "trn3":
        return 4096 if dst_itemsize >= 4 else 8192
    return 512


def psum_tile_bytes(target=None):
    """Largest PSUM tile per partition: one 2 KiB bank up to trn2; trn3's
    wide matmuls (4096 fp32 columns) span all 8 banks."""
    return PSUM_BANK_BYTES * (PSUM_BANKS if (target or current()) == "trn3" else 1)


def sbuf_partition_bytes(target=None):
    return _SBUF_PARTITION_BYTES[target or current()]


class _TileSize:
    """``nl.tile_size``: the tile limits kernels size their loops with."""

    pmax = PMAX
    psum_bank_fmax = PSUM_BANK_BYTES // 4
    psum_fmax = psum_bank_fmax  # the pre-0.3 name
    gemm_stationary_fmax = GEMM_STATIONARY_FMAX
    # Kernels tile N with this; 512 fits every generation.
    gemm_moving_fmax = 512
    bn_stats_fmax = BN_STATS_FMAX

    @property
    def total_available_sbuf_size(self):
        return sbuf_partition_bytes()

    def __repr__(self):
        return (f"tile_size(pmax={self.pmax}, psum_bank_fmax={self.psum_bank_fmax}, "
                f"gemm_stationary_fmax={self.gemm_stationary_fmax}, gemm_moving_fmax={self.gemm_moving_fmax})")


tile_size = _TileSize()
