"""The backward's launch config (``BwdConfig``), its validity rules, and how a launch splits one
block of keys' dK/dV work over several programs (``dkdv_split``)."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import torch

from flashtune.configs.base import (ATOMIC_DQ_MAX_HEAD_DIM, DKDV_MIN_CHUNK, DKDV_PROGRAMS_PER_SM, MAX_DKDV_SPLIT,
                                    ConfigError, _check_block, _check_flag, _check_launch, _check_smem, _check_tma,
                                    _ConfigBase, _element_size, padded_head_dim)
from flashtune.configs.gluon import GluonBwdConfig
from flashtune.device import resolve_device

# dK/dV kernel's unused fields; with the Gluon dQ kernel (2) also the Triton dQ kernel's
_GLUON_DKDV_UNUSED = {"num_warps": (4, (1, 2, 4, 8, 16)), "atomic_dq": (0, (0, 1))}
_BLOCKS = (16, 32, 64, 128, 256)
_FUSED_DQ_UNUSED = {**_GLUON_DKDV_UNUSED, "dq_num_warps": (4, (1, 2, 4, 8, 16)), "BLOCK_M2": (64, _BLOCKS),
                    "BLOCK_N2": (64, _BLOCKS), "dq_num_stages": (2, range(1, 9)), "tma": (0, (0, 1))}
# dq_first orders the fused dQ's share (families 3 and 4): the others have none
_NO_DQ_SHARE = {"dq_first": (0, (0, 1))}
_BWD_UNUSED_BY_FAMILY = {
    0: _NO_DQ_SHARE,
    1: {**_GLUON_DKDV_UNUSED, **_NO_DQ_SHARE},
    2: {**_GLUON_DKDV_UNUSED, **_NO_DQ_SHARE, "dq_num_warps": (4, (1, 2, 4, 8, 16)), "BLOCK_M2": (64, _BLOCKS),
        "tma": (0, (0, 1))},
    # the fused dQ (each step's share in its step, or a step late): no dQ kernel, no dQ half
    3: _FUSED_DQ_UNUSED,
    4: _FUSED_DQ_UNUSED,
}
BWD_FAMILIES = (0, 1, 2, 3, 4)


def _check_gluon_dq_head_dim(family: int, head_dim: int) -> None:
    """The Gluon dQ kernel (family 2) runs head dims 64 and 128 only (the D=256 dK/dV kernel fuses dQ or
    leaves it to the Triton dQ kernel)."""
    if family == 2 and head_dim > 128:
        raise ConfigError(f"family: the Gluon dQ kernel (family 2) runs head dims up to 128, got head_dim {head_dim}; "
                          "use family 1 or 3")


@dataclasses.dataclass(frozen=True, order=True)
class BwdConfig(_ConfigBase):
    """Backward launch config.

    The dK/dV kernel holds a BLOCK_N1 block of keys and walks the queries in blocks of
    BLOCK_M1, with num_warps and num_stages. dQ comes one of two ways:
    - ``atomic_dq=0``: a dQ kernel holds a BLOCK_M2 block of queries and walks the keys
      in blocks of BLOCK_N2, with dq_num_warps and dq_num_stages (default: the dK/dV
      kernel's); it recomputes the scores, 7 matmuls in all;
    - ``atomic_dq=1``: the dK/dV kernel adds each key block's share of dQ into an fp32
      buffer with atomic adds (5 matmuls in all; the order of the adds, hence dQ's last
      bits, varies from run to run; under ``torch.use_deterministic_algorithms`` the dQ
      kernel runs instead). BLOCK_M2, BLOCK_N2, dq_num_warps and dq_num_stages are unused.
    Constraints: the four blocks powers of two in [16, 256] (with no rule between them:
    the dK/dV kernel finds the query blocks that straddle the causal diagonal by ceiling
    division, so BLOCK_N1 need not be a multiple of BLOCK_M1); warps in {1, 2, 4, 8, 16};
    stages in [1, 8]; atomic_dq 0 or 1; the estimated shared memory of each kernel within
    the device's limit. ``tma=1`` loads the walked tiles (Q and dO in the dK/dV kernel, K
    and V in the dQ kernel) through TMA descriptors, under the forward's conditions (see
    FwdConfig); with ``atomic_dq=1`` on a GPU it also sends each tile's dQ share as one
    TMA bulk reduce-add instead of an atomic add per element.

    ``dkdv_split``: how many programs share one block of keys' dK/dV (0 to 16; 0, the
    default, lets ``dkdv_split()`` choose at launch from the shape and the SM count). The
    programs of a block split the query heads of its group (as far as the split divides
    the group) and then the query blocks; each writes fp32 partials that one more kernel
    sums in a fixed order (deterministic) and casts. It fills the GPU when key blocks x
    K/V heads x batch is small (one K/V head, batch 1), at the cost of the partials'
    traffic and one launch; on a shape that fills the GPU an explicit value is lowered
    (see ``dkdv_split()``).

    The kernel family, ``family``: 0 (the default) the Triton kernels above; 1 the Gluon
    warp-specialised dK/dV kernel for sm_90 (kernels/gluon/: a TMA producer warp
    and two consumer warp groups of BLOCK_N1 keys each, so a program covers 2 x BLOCK_N1
    keys, walking BLOCK_M1 queries a step; num_stages is its Q/dO ring's slot count) with
    the Triton preprocess and dQ kernel (the dQ half's fields and ``tma`` apply to it); 2 the
    same dK/dV kernel and the Gluon dQ kernel (two consumer warp groups of BLOCK_M2 = 64
    queries each walking BLOCK_N2 keys a step through a ring of dq_num_stages K/V slots).
    A Gluon config validates only for BLOCK_N1 64, head dims 64 and 128, float16/bfloat16
    and a device of compute capability 9.0; num_warps and atomic_dq do not apply to it (its
    canonical form fixes them: 4, 0; family 2 also dq_num_warps 4, BLOCK_M2 64 and tma 0);
    ``dkdv_split`` does, with its own auto target (``dkdv_split()``; configs stored before it
    did hold 1, unsplit, and launch as they did). Family 3: the Gluon dK/dV kernel computing
    dQ too (GluonBwdConfig.DQ_FUSED: TMA bulk reduce-adds into an fp32 buffer, five matmuls;
    BLOCK_M1 64 only; no dQ half, its fields fixed at 64, 64, 4 warps, 2 stages, tma 0; under
    ``torch.use_deterministic_algorithms`` dQ comes from the Triton default's dQ kernel);
    family 4 the same with each step's dQ share computed a step late (DQ_FUSED=2); for both,
    ``dq_first`` 1 issues the share's wgmmas ahead of the step's dV and dK and stores it under
    them (GluonBwdConfig.DQ_FIRST; the other families hold 0), chosen per key by the search. A
    call the Gluon kernels cannot run (a softcap, a window, packed sequences, dropout) runs
    the Triton default (kernels/passes.as_triton).
    """

    BLOCK_M1: int
    BLOCK_N1: int
    BLOCK_M2: int
    BLOCK_N2: int
    num_warps: int
    num_stages: int
    dq_num_warps: int | None = None
    dq_num_stages: int | None = None
    atomic_dq: int = 0
    tma: int = 0
    dkdv_split: int = 0
    family: int = 0
    dq_first: int = 0

    PASS: ClassVar[str] = "bwd"
    UNUSED_BY_FAMILY: ClassVar[dict] = _BWD_UNUSED_BY_FAMILY
    # the fields only the dQ kernel uses (a config's "dQ half")
    DQ_FIELDS: ClassVar[tuple[str, ...]] = ("BLOCK_M2", "BLOCK_N2", "dq_num_warps", "dq_num_stages")

    def __post_init__(self) -> None:
        # the dQ kernel's launch values default to the dK/dV kernel's (configs stored
        # before these fields existed launched both kernels with one pair)
        if self.dq_num_warps is None:
            object.__setattr__(self, "dq_num_warps", self.num_warps)
        if self.dq_num_stages is None:
            object.__setattr__(self, "dq_num_stages", self.num_stages)
        self._flags_as_ints("atomic_dq", "tma", "family", "dq_first")
        self._fix_unused_fields()

    def label(self) -> str:
        """Compact: ``M1xN1/M2xN2 wW sS`` (dK/dV then dQ blocks), ``M1xN1 wW sS / M2xN2 wW sS``
        when the dQ kernel has its own warps or stages, ``M1xN1 wW sS atomic-dQ`` when dQ is
        accumulated in the dK/dV kernel; `` tma`` when tiles load through TMA."""
        launch = f"w{self.num_warps} s{self.num_stages}"
        dq_launch = f"w{self.dq_num_warps} s{self.dq_num_stages}"
        tma = " tma" if self.tma else ""
        # the Gluon families' labels: every field but dkdv_split shown or fixed by the family
        gluon_shown = tuple(name for name in self.FIELDS if name != "dkdv_split")
        if self.family >= 3:  # ``gluon 2xN1 mM1 bS fused-dQ[ late]``: dQ in the Gluon dK/dV kernel
            return (f"gluon 2x{self.BLOCK_N1} m{self.BLOCK_M1} b{self.num_stages} fused-dQ"
                    f"{' late' if self.family == 4 else ''}{' first' if self.dq_first else ''}"
                    + self._extra_label(gluon_shown))
        if self.family == 2:  # ``gluon 2xN1 mM1 bS / gluon-dq nN2 bS``: both Gluon kernels
            return (f"gluon 2x{self.BLOCK_N1} m{self.BLOCK_M1} b{self.num_stages} / gluon-dq n{self.BLOCK_N2} "
                    f"b{self.dq_num_stages}" + self._extra_label(gluon_shown))
        if self.family:  # ``gluon 2xN1 mM1 bS / M2xN2 wW sS``: the Gluon dK/dV kernel, the dQ kernel
            return (f"gluon 2x{self.BLOCK_N1} m{self.BLOCK_M1} b{self.num_stages} / {self.BLOCK_M2}x{self.BLOCK_N2} "
                    f"{dq_launch}{tma}" + self._extra_label(gluon_shown))
        if self.atomic_dq:
            text = f"{self.BLOCK_M1}x{self.BLOCK_N1} {launch} atomic-dQ{tma}"
        elif dq_launch == launch:
            text = f"{self.BLOCK_M1}x{self.BLOCK_N1}/{self.BLOCK_M2}x{self.BLOCK_N2} {launch}{tma}"
        else:
            text = f"{self.BLOCK_M1}x{self.BLOCK_N1} {launch} / {self.BLOCK_M2}x{self.BLOCK_N2} {dq_launch}{tma}"
        shown = ("BLOCK_M1", "BLOCK_N1", "num_warps", "num_stages", "atomic_dq", "tma", *self.DQ_FIELDS)
        return text + self._extra_label(shown)

    def gluon(self):
        """The Gluon dK/dV kernel's own config class for this config (configs/gluon.py)."""
        dq = dict(DQ_BLOCK_N=self.BLOCK_N2, DQ_BUFFERS=self.dq_num_stages) if self.family == 2 else {}
        if self.family >= 3:
            dq = dict(DQ_FUSED=self.family - 2, DQ_FIRST=self.dq_first)
        return GluonBwdConfig(BLOCK_M=self.BLOCK_M1, BLOCK_N=self.BLOCK_N1, NUM_BUFFERS=self.num_stages, **dq)

    def validate_anywhere(self, head_dim: int, dtype: torch.dtype) -> "BwdConfig":
        """A Gluon config: against sm_90's limits, the one architecture it runs on."""
        if not self.family:
            return super().validate_anywhere(head_dim, dtype)
        self.check_fields()
        _check_gluon_dq_head_dim(self.family, head_dim)
        self.gluon().validate(head_dim, dtype, None)
        return self

    def check_fields(self) -> None:
        for name in ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2"):
            _check_block(name, getattr(self, name))
        _check_launch(self.num_warps, self.num_stages)
        _check_launch(self.dq_num_warps, self.dq_num_stages, prefix="dq_")
        _check_flag("atomic_dq", self.atomic_dq)
        _check_flag("tma", self.tma)
        _check_flag("dq_first", self.dq_first)
        if type(self.family) is not int or self.family not in BWD_FAMILIES:
            raise ConfigError(f"family: expected one of {BWD_FAMILIES} (0 Triton, 1 the Gluon dK/dV kernel, 2 both "
                              f"Gluon kernels, 3 and 4 the Gluon dK/dV kernel with dQ fused), got {self.family!r}")
        if (not isinstance(self.dkdv_split, int) or isinstance(self.dkdv_split, bool)
                or not 0 <= self.dkdv_split <= MAX_DKDV_SPLIT):
            raise ConfigError(f"dkdv_split: expected an integer in [0, {MAX_DKDV_SPLIT}] (0: chosen at launch), "
                              f"got {self.dkdv_split!r}")

    def canonical(self) -> "BwdConfig":
        """With atomic dQ the dQ kernel's fields are unused (but for deterministic mode): they
        take the dK/dV kernel's values, blocks swapped (the dQ kernel holds BLOCK_M2 queries
        as the dK/dV kernel holds BLOCK_N1 keys), so the canonical form fits wherever the
        config does."""
        if not self.atomic_dq:
            return self
        return dataclasses.replace(self, BLOCK_M2=self.BLOCK_N1, BLOCK_N2=self.BLOCK_M1,
                                   dq_num_warps=self.num_warps, dq_num_stages=self.num_stages)

    def shared_memory(self, head_dim: int, dtype: torch.dtype) -> int:
        d, e = padded_head_dim(head_dim), _element_size(dtype)
        # Each kernel: its two held tiles, num_stages buffers of the two walked tiles, and
        # layout-conversion scratch for the fp32 score block, which grows with the warps
        # for fp32 inputs: an upper bound of what triton allocates for sm_90
        # (tests/kernels/test_shared_memory_sm90.py holds it to the compiled kernels). The
        # atomic-dQ dK/dV kernel needs 24-40 KiB more than the plain one at D=128 bf16. Under
        # deterministic mode an atomic config runs the dQ kernel with its blocks, so that
        # kernel's estimate counts either way.
        def scratch(warps: int) -> int:
            return max(9, warps + 1) if e == 4 else 2

        tiles = e * d * (2 * self.BLOCK_N1 + 2 * self.num_stages * self.BLOCK_M1)
        dkdv = tiles + 4 * self.BLOCK_M1 * self.BLOCK_N1 * scratch(self.num_warps)
        if self.atomic_dq and self.tma:
            # dQ's bulk reduce-adds (sm_90+): the fp32 dQ tile is staged in shared memory,
            # plus conversion scratch that grows with BLOCK_N1, more below 64 query rows
            # (fitted to the configs compiled for sm_90)
            scratch_per_key = 5 * self.BLOCK_M1 // 2 if self.BLOCK_M1 >= 64 else 340
            dkdv = tiles + 4 * self.BLOCK_M1 * d + self.BLOCK_N1 * scratch_per_key
        elif self.atomic_dq:
            # the fp32 dQ block goes through shared memory on its way to the atomic adds;
            # below 64 query rows the dS^T K product's operands do too (sized as for at
            # least 32 rows: 16-row blocks took as much as 32-row ones)
            m = max(self.BLOCK_M1, 32)
            dkdv = max(dkdv + e * self.BLOCK_M1 * self.BLOCK_N1 // 8,
                       tiles + 1024 + 4 * m * d + (8 * m * self.BLOCK_N1 if self.BLOCK_M1 < 64 else 0))
        if self.family >= 3:  # one kernel (the Triton dQ kernel of the deterministic fallback is the default's)
            return self.gluon().shared_memory(head_dim, dtype)
        if self.family == 2:  # the Gluon kernels' own estimates
            return max(self.gluon().shared_memory(head_dim, dtype), self.gluon().dq_shared_memory(head_dim, dtype))
        dq = self._dq_shared_memory(head_dim, dtype)
        if self.family:  # the Gluon dK/dV kernel's own estimate, with the Triton dQ kernel's
            return max(self.gluon().shared_memory(head_dim, dtype), dq + 1024 * self.tma)
        # TMA loads add their barriers and alignment: at most 1 KiB per kernel over the
        # pointer kernels
        return max(dkdv, dq) + 1024 * self.tma

    def _dq_shared_memory(self, head_dim: int, dtype: torch.dtype) -> int:
        """The dQ kernel's estimate (shared_memory's terms), without TMA's barriers."""
        d, e = padded_head_dim(head_dim), _element_size(dtype)
        scratch = max(9, self.dq_num_warps + 1) if e == 4 else 2
        return e * d * (2 * self.BLOCK_M2 + 2 * self.dq_num_stages * self.BLOCK_N2) \
            + 4 * self.BLOCK_M2 * self.BLOCK_N2 * scratch

    def validate(self, head_dim: int, dtype: torch.dtype, device=None, dropout: bool = False) -> "BwdConfig":
        """Raise ConfigError naming the field if this config cannot run; return self. The
        estimate covers the DROPOUT kernels as they are (``dropout`` changes nothing: compiled
        for sm_90, tests/kernels/test_shared_memory_sm90.py).

        A Gluon config (``family=1``) is checked by GluonBwdConfig.validate on the device
        (None: the current CUDA device, else the CPU), which must be a CUDA sm_90 one, and its
        dQ half as the Triton dQ kernel's; a call with dropout runs the Triton fallback instead
        (kernels/passes.py checks that one)."""
        self.check_fields()
        if self.family:
            _check_gluon_dq_head_dim(self.family, head_dim)
            self.gluon().validate(head_dim, dtype, device if device is not None else resolve_device())
            if self.family >= 2:
                return self
            if self.tma:
                _check_tma(head_dim, dtype, device)
            _check_smem("BwdConfig", self._dq_shared_memory(head_dim, dtype) + 1024 * self.tma, device)
            return self
        if self.atomic_dq and padded_head_dim(head_dim) > ATOMIC_DQ_MAX_HEAD_DIM:
            raise ConfigError(f"atomic_dq: supported up to head_dim {ATOMIC_DQ_MAX_HEAD_DIM}, got head_dim {head_dim}; "
                              "use atomic_dq=0")
        if self.tma:
            _check_tma(head_dim, dtype, device)
        _check_smem("BwdConfig", self.shared_memory(head_dim, dtype), device)
        return self


def dkdv_split(config: BwdConfig, *, batch: int, heads_q: int, heads_kv: int, n_q: int, n_k: int,
               sm_count: int) -> tuple[int, int]:
    """(head splits, query splits) of one block of keys' dK/dV work for a launch of ``config``.

    An explicit ``config.dkdv_split`` S splits the group's query heads gcd(S, group) ways and
    the query blocks the rest (at most one chunk per query block; S is lowered until key
    blocks x K/V heads x batch x S is at most twice the auto target). With 0 (auto): no split
    once key blocks x K/V heads x batch reaches DKDV_PROGRAMS_PER_SM programs per SM;
    otherwise the smallest divisor of the group that reaches it (at most MAX_DKDV_SPLIT),
    and query chunks (powers of two, of at least DKDV_MIN_CHUNK blocks) only while that
    still leaves the GPU less than half that full: head splits pay on calls of one K/V head
    (2.1x unsplit at B=2 Hq=8 Hkv=1 N=4k D=128 causal), query chunks cost (their partials'
    traffic), docs/tune-your-model.md.

    (The Gluon dK/dV kernel applies the same rule to its own program size and target.)
    """
    return split_work(config.dkdv_split, block_m=config.BLOCK_M1, keys_per_program=config.BLOCK_N1,
                      programs_per_sm=DKDV_PROGRAMS_PER_SM, batch=batch, heads_q=heads_q, heads_kv=heads_kv,
                      n_q=n_q, n_k=n_k, sm_count=sm_count)


def split_work(requested: int, *, block_m: int, keys_per_program: int, programs_per_sm: int, batch: int,
               heads_q: int, heads_kv: int, n_q: int, n_k: int, sm_count: int) -> tuple[int, int]:
    """``dkdv_split``'s rule for a kernel of ``keys_per_program`` keys and ``block_m``
    queries a step, targeting ``programs_per_sm`` programs per SM; ``requested`` as
    ``BwdConfig.dkdv_split`` (0: auto)."""
    group = heads_q // heads_kv
    q_blocks = -(-n_q // block_m)
    programs = -(-n_k // keys_per_program) * heads_kv * batch
    target = programs_per_sm * sm_count
    # an explicit split (tuned where the key's shape left the GPU idle) never takes the grid
    # past twice the target: the partials cost 2 x split x dK's size in fp32
    split = max(1, min(requested, 2 * target // programs)) if requested else 0
    if split == 0:
        if programs >= target:
            return 1, 1
        divisors = [d for d in range(1, min(group, MAX_DKDV_SPLIT) + 1) if group % d == 0]
        split = next((d for d in divisors if programs * d >= target), divisors[-1])
        while (2 * programs * split <= target and 2 * split <= MAX_DKDV_SPLIT
               and 2 * split // divisors[-1] * DKDV_MIN_CHUNK <= q_blocks):
            split *= 2
    split_h = math.gcd(split, group)
    split_q = max(1, min(split // split_h, q_blocks))
    return split_h, split_q
