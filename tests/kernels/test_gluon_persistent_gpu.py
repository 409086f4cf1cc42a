"""On an H100/H200: the Gluon forward's persistent variant (GluonFwdConfig.PERSISTENT).

One CTA per SM at most walks tiles of 2 x BLOCK_M query rows with the K/V ring, its
barriers and the ping-pong turns carried from tile to tile, and each tile's Q reloaded
once both consumers released the previous one's. Every tile computes its rows exactly as
the grid kernel's CTA for them does (same key blocks, same order), so o and the LSE must be
**bitwise** those of the same config with PERSISTENT=0, on calls with many more tiles than
SMs; one case per config is also checked against the float64 reference. Marked ``gpu``;
sm_90 only. Its own smoke call (a hang in the persistent protocol fails these tests at
once, and leaves test_gluon_gpu.py's alone).

Run: ``python -m pytest -m gpu tests/kernels/test_gluon_persistent_gpu.py -q``.
"""

from __future__ import annotations

import dataclasses

import pytest
import test_gluon_gpu
import torch
from kernel_checks import smoke_in_subprocess
from test_gluon_gpu import _inputs, check_gluon_forward

from flashtune.configs.gluon import GluonFwdConfig
from flashtune.device import sm_count
from flashtune.kernels.gluon.persistent import persistent_v_buffers

gluon_forward = test_gluon_gpu.gluon_forward  # kernels/gluon/forward_launch.py
pytestmark = test_gluon_gpu.pytestmark  # gpu, and sm_90 only

# 4 x 8 heads x 8 tiles of 128 rows = 256 tiles: every CTA of a 132-SM GPU runs one or two
SMOKE = """
import torch
from flashtune.configs.gluon import GluonFwdConfig
from flashtune.kernels.gluon import forward_launch as g
q, k, v = (torch.randn(4, 8, 1000, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
tma_store = g._tma_store
# without the O tiles, then with them with either store (O_TILE; the register store of an output the
# copy engine cannot address)
for o_tile, registers in ((0, False), (1, False), (1, True)):
    g._tma_store = (lambda dtype: False) if registers else tma_store
    for overlap in (0, 1):
        for pingpong in (0, 1):
            for causal in (False, True):
                cfg = GluonFwdConfig(NUM_BUFFERS=2, OVERLAP=overlap, PINGPONG=pingpong, PERSISTENT=1, O_TILE=o_tile)
                g.gluon_attention_forward(q, k, v, cfg, causal=causal, sm_scale=None)
                torch.cuda.synchronize()
# D=128 with 3 slots: the O tiles with V's ring a slot shorter than K's (persistent_v_buffers)
q, k, v = (torch.randn(4, 8, 1000, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
g._tma_store = tma_store
for overlap in (0, 1):
    for causal in (False, True):
        cfg = GluonFwdConfig(NUM_BUFFERS=3, OVERLAP=overlap, PERSISTENT=1, O_TILE=1)
        g.gluon_attention_forward(q, k, v, cfg, causal=causal, sm_scale=None)
        torch.cuda.synchronize()
"""


@pytest.fixture(scope="module", autouse=True)
def _the_persistent_kernel_comes_back():
    smoke_in_subprocess(SMOKE, what="the persistent Gluon forward",
                        hang_hint="a hang on 4x8x1000x64 with two tiles per CTA: the Q-empty barriers or the "
                                  "ring's and turns' phases carried across tiles (O_TILE: the early "
                                  "Q release, the O tiles' store waits; at D=128 V's shorter ring: _load_kv's "
                                  "wait for the V slot)")


C = GluonFwdConfig
CONFIGS = [
    C(NUM_BUFFERS=3, PERSISTENT=1),  # the D=128 default's shape
    C(PERSISTENT=1),
    C(OVERLAP=0, PERSISTENT=1),  # the D=64 default's shape
    C(PINGPONG=0, PERSISTENT=1),
    C(OVERLAP=0, PINGPONG=0, PERSISTENT=1),
    C(BLOCK_N=64, NUM_BUFFERS=4, PERSISTENT=1),
]
CASES = [  # batch, (Hq, Hkv), n_q, n_k, head_dim, causal, causal_align, window
    (4, (16, 4), 2048, 2048, 128, True, "top_left", None),  # 1024 tiles: about 8 per CTA
    (3, (8, 2), 1000, 4096, 128, False, "top_left", None),
    (3, (8, 8), 777, 1000, 64, True, "bottom_right", None),
    # bottom-right with Nq > Nk: the first tiles see no key (n_blocks 0: no ring traffic, Q still loaded)
    (8, (4, 2), 1000, 200, 64, True, "bottom_right", None),
    (2, (8, 2), 4096, 4096, 128, True, "top_left", (1000, 0)),  # a window: each tile its own first block
    (64, (4, 1), 17, 17, 64, False, "top_left", None),  # one block per tile, 256 tiles
]


def _case_id(c):
    b, (hq, hkv), n_q, n_k, d, causal, align, window = c
    return (f"b{b}h{hq}kv{hkv}q{n_q}k{n_k}d{d}{'-causal' if causal else ''}{'-br' if align == 'bottom_right' else ''}"
            f"{f'-w{window[0]}.{window[1]}' if window else ''}")


def _both(q, k, v, cfg, **kw):
    grid = gluon_forward.gluon_attention_forward(q, k, v, dataclasses.replace(cfg, PERSISTENT=0, O_TILE=0), **kw)
    persistent = gluon_forward.gluon_attention_forward(q, k, v, cfg, **kw)
    torch.cuda.synchronize()
    return grid, persistent


def _assert_the_grid_kernels_bits(config, case, seed):
    """o and the LSE of the persistent ``config`` on ``case`` bit for bit the grid kernel's."""
    b, heads, n_q, n_k, d, causal, align, window = case
    q, k, v = _inputs(n_q, n_k, d, torch.bfloat16, heads=heads, batch=b, seed=seed)
    tiles = -(-n_q // (2 * config.BLOCK_M)) * heads[0] * b
    assert tiles > sm_count(q.device), "the case must give CTAs more than one tile"
    (o_grid, lse_grid), (o, lse) = _both(q, k, v, config, causal=causal, sm_scale=None, causal_align=align,
                                         window_size=window)
    assert torch.equal(o, o_grid), (o - o_grid).abs().max()
    assert torch.equal(lse, lse_grid)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.short())
def test_persistent_gives_the_grid_kernels_bits(config, case):
    _assert_the_grid_kernels_bits(config, case, seed=11)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.short())
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_persistent_against_the_reference(config, head_dim, causal):
    """GQA, odd lengths, 3 x 8 heads x 8 tiles (192 tiles) against float64, fp16."""
    d = head_dim
    q, k, v = _inputs(1000, 1337, d, torch.float16, heads=(8, 2), batch=3, seed=12)
    check_gluon_forward(q, k, v, dtype_name="fp16", causal=causal, config=config)


# two CTAs per SM (GluonFwdConfig.programs_per_sm): 104 registers a consumer thread, D=64 64x64 blocks
TWO_PER_SM = [C(BLOCK_N=64, OVERLAP=0, CONSUMER_REGS=104, PERSISTENT=1),
              C(BLOCK_N=64, OVERLAP=0, CONSUMER_REGS=104, PERSISTENT=1, O_TILE=1),
              C(BLOCK_N=64, OVERLAP=0, CONSUMER_REGS=104, PINGPONG=0, NUM_BUFFERS=3, PERSISTENT=1, O_TILE=1)]
TWO_PER_SM_CASES = [c for c in CASES if c[4] == 64] + [
    (16, (8, 8), 1000, 1000, 64, True, "top_left", None),  # 1024 tiles: about 4 per CTA at two CTAs an SM
    (4, (8, 2), 2048, 1500, 64, False, "top_left", None),
]


@pytest.mark.parametrize("case", TWO_PER_SM_CASES, ids=_case_id)
@pytest.mark.parametrize("config", TWO_PER_SM, ids=lambda c: c.short())
def test_two_ctas_per_sm_give_the_grid_kernels_bits(config, case):
    assert config.programs_per_sm(64, torch.bfloat16) == 2
    _assert_the_grid_kernels_bits(config, case, seed=13)


# and the grid kernel at two CTAs per SM, without ping-pong the D=64 middle band's default without masking
@pytest.mark.parametrize("config", TWO_PER_SM + [C(BLOCK_N=64, OVERLAP=0, CONSUMER_REGS=104),
                                                 C(BLOCK_N=64, OVERLAP=0, CONSUMER_REGS=104, PINGPONG=0)],
                         ids=lambda c: c.short())
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_two_ctas_per_sm_against_the_reference(config, causal):
    q, k, v = _inputs(1000, 1337, 64, torch.float16, heads=(8, 2), batch=3, seed=14)
    check_gluon_forward(q, k, v, dtype_name="fp16", causal=causal, config=config)


@pytest.mark.parametrize("units", [1, 5])
def test_persistent_heaviest_first_order_gives_the_same_bits(units, monkeypatch):
    """Causal calls with the heaviest-first 1-D order (LPT_UNITS > 0, the grid's and the persistent
    CTAs'): each tile's rows are still computed as the grid kernel's."""
    monkeypatch.setattr(gluon_forward, "query_lpt_units", lambda *a, **kw: units)
    monkeypatch.setattr(gluon_forward, "persistent_lpt_units", lambda *a, **kw: units)
    q, k, v = _inputs(3000, 3000, 128, torch.bfloat16, heads=(12, 4), batch=2, seed=13)
    (o_grid, lse_grid), (o, lse) = _both(q, k, v, C(NUM_BUFFERS=3, PERSISTENT=1), causal=True, sm_scale=None)
    assert torch.equal(o, o_grid) and torch.equal(lse, lse_grid)


@pytest.mark.parametrize("o_tile", [False, True], ids=["", "o-tile"])
def test_persistent_fp8_gives_the_grid_kernels_bits(o_tile, monkeypatch):
    """The FP8 variant (V^T tiles; P through each consumer's shared-memory tile with the overlap);
    with O_TILE, the register store's early Q release beside those P tiles."""
    gen = torch.Generator(device="cuda").manual_seed(14)
    q, k, v = (torch.randn(4, 8, 1500, 128, device="cuda", generator=gen).to(torch.float8_e4m3fn) for _ in range(3))
    v = v.transpose(2, 3).contiguous().transpose(2, 3)  # keys contiguous (fp8.keys_contiguous's layout)
    o_tile = int(o_tile)
    for cfg in (C(NUM_BUFFERS=3, PERSISTENT=1, O_TILE=o_tile), C(OVERLAP=0, PERSISTENT=1, O_TILE=o_tile)):
        for causal in (False, True):
            (o_grid, lse_grid), (o, lse) = _both(q, k, v, cfg, causal=causal, sm_scale=0.05)
            assert torch.equal(o, o_grid) and torch.equal(lse, lse_grid), (cfg.short(), causal)


@pytest.mark.parametrize("block_major", [False, True], ids=["unit-major", "block-major"])
@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize("config", [C(NUM_BUFFERS=3, PERSISTENT=1), C(OVERLAP=0, PERSISTENT=1)],
                         ids=lambda c: c.short())
def test_either_snake_order_gives_the_grid_kernels_bits(config, case, block_major, monkeypatch):
    """The snake over the unit-major order and over the block-major one (persistent_lpt_units picks
    one per call; both forced here, causal or not): every tile's rows still as the grid kernel
    computes them."""
    monkeypatch.setattr(gluon_forward, "persistent_lpt_units",
                        lambda n_q, n_k, units, *a, **kw: units if block_major else 0)
    _assert_the_grid_kernels_bits(config, case, seed=15)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize("config,tma_store", [(C(PERSISTENT=1, O_TILE=1), True),
                                              (C(OVERLAP=0, PERSISTENT=1, O_TILE=1), True),
                                              (C(NUM_BUFFERS=3, PERSISTENT=1, O_TILE=1), False),
                                              (C(NUM_BUFFERS=3, PERSISTENT=1, O_TILE=1), True)],
                         ids=lambda c: c.short() if isinstance(c, GluonFwdConfig) else "tma" if c else "registers")
def test_the_o_tiles_give_the_grid_kernels_bits(config, tma_store, case, monkeypatch):
    """O_TILE: each consumer's O through a tile of its own (D=64; D=128 with 2 buffers,
    and with 3 beside V's ring a slot shorter than K's) and its Q tile released before the last
    P V, reloaded under it while the bulk store of the previous tile may still read its O tile
    (``tma_store`` False: the register store of an output the copy engine cannot address, forced);
    every tile's rows still as the grid kernel computes them."""
    if not tma_store:
        monkeypatch.setattr(gluon_forward, "_tma_store", lambda dtype: False)
    _assert_the_grid_kernels_bits(config, case, seed=16)


# D=128 tiles of 1 to 4 key blocks, many per CTA: V's 2-slot ring beside K's 3 (persistent_v_buffers)
# laps the K ring out of step, with the persistent pre-loads of a tile's first blocks
SHORT_V_CASES = [
    (64, (4, 1), 300, 300, 128, True, "top_left", None),
    (32, (8, 8), 130, 130, 128, False, "top_left", None),
    (16, (8, 2), 512, 512, 128, False, "top_left", None),
    (16, (8, 2), 600, 333, 128, True, "bottom_right", None),
]


@pytest.mark.parametrize("case", SHORT_V_CASES, ids=_case_id)
@pytest.mark.parametrize("config", [C(NUM_BUFFERS=3, PERSISTENT=1, O_TILE=1),
                                    C(NUM_BUFFERS=3, OVERLAP=0, PERSISTENT=1, O_TILE=1)], ids=lambda c: c.short())
def test_the_shorter_v_ring_gives_the_grid_kernels_bits(config, case):
    assert persistent_v_buffers(config, 128, torch.bfloat16, True) == 2
    _assert_the_grid_kernels_bits(config, case, seed=17)
