"""On an H100/H200: the Gluon kernels' own instrumentation (``trace=``, kernels/gluon/trace.py).

A traced call must give the untraced call's o and LSE **bit for bit** (the stamps only read
the cycle counter and store it), and its trace must be one the kernel's schedule explains:
every (tile, partition) stamped, each tile's key block count the one its rows need, the
stamps of each partition in program order (the SM's cycle counter does not run backwards
within a CTA), a grid CTA's tile its place in the launch order and, with PERSISTENT, each CTA's
tiles numbered 0, 1, ... in the order it ran them. Marked ``gpu``; sm_90 only.

Run: ``python -m pytest -m gpu tests/kernels/test_gluon_trace_gpu.py -q``.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
import test_gluon_gpu
import torch
from test_gluon_gpu import _inputs

from flashtune.configs.gluon import GluonBwdConfig, GluonFwdConfig, default_gluon_config
from flashtune.device import sm_count
from flashtune.kernels.common import causal_offset, cdiv
from flashtune.kernels.gluon import backward_launch as gluon_backward
from flashtune.kernels.gluon import trace as kt

gluon_forward = test_gluon_gpu.gluon_forward  # kernels/gluon/forward_launch.py
pytestmark = test_gluon_gpu.pytestmark  # gpu, and sm_90 only

C = GluonFwdConfig
CONFIGS = [
    C(NUM_BUFFERS=3),  # the D=128 default
    C(OVERLAP=0),  # the D=64 default's shape: the sequential loop
    C(PINGPONG=0),
    C(NUM_BUFFERS=3, PERSISTENT=1),
]
CASES = [  # batch, (Hq, Hkv), n_q, n_k, head_dim, causal, causal_align, window
    (2, (8, 2), 1000, 2048, 128, True, "top_left", None),
    (2, (4, 4), 777, 1000, 64, False, "top_left", None),
    (4, (4, 2), 1000, 200, 64, True, "bottom_right", None),  # the first tiles see no key: no blocks
    (1, (8, 2), 4096, 4096, 128, True, "top_left", (1000, 0)),
]


def _case_id(c):
    b, (hq, hkv), n_q, n_k, d, causal, align, window = c
    return (f"b{b}h{hq}kv{hkv}q{n_q}k{n_k}d{d}{'-causal' if causal else ''}{'-br' if align == 'bottom_right' else ''}"
            f"{f'-w{window[0]}.{window[1]}' if window else ''}")


def _blocks_per_tile(cfg, n_q, n_k, causal, off):
    """Each query tile's key block count (gluon/forward.py's _key_blocks without a window), in
    query-tile order."""
    rows = 2 * cfg.BLOCK_M
    out = []
    for start in range(0, n_q, rows):
        hi = max(min(start + rows + off, n_k), 0) if causal else n_k
        out.append(cdiv(hi, cfg.BLOCK_N))
    return out


@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.short())
def test_a_traced_call_gives_the_untraced_bits_and_a_consistent_trace(config, case):
    b, heads, n_q, n_k, d, causal, align, window = case
    q, k, v = _inputs(n_q, n_k, d, torch.bfloat16, heads=heads, batch=b, seed=5)
    kw = dict(causal=causal, causal_align=align, window_size=window)
    o, lse = gluon_forward.gluon_attention_forward(q, k, v, config, **kw)
    trace = gluon_forward.trace_buffer(q, k, config)
    o_t, lse_t = gluon_forward.gluon_attention_forward(q, k, v, config, trace=trace, **kw)
    torch.cuda.synchronize()
    assert torch.equal(o, o_t) and torch.equal(lse, lse_t)

    t = trace.cpu().numpy()
    acc = kt.account(t, config.OVERLAP, sms=sm_count(q.device))  # every (tile, partition) stamped
    assert sum(acc.consumer.values()) == pytest.approx(1.0)
    n = t[:, 0, kt.H_N_BLOCKS]
    if window is None:
        want = _blocks_per_tile(config, n_q, n_k, causal, causal_offset(align, n_q, n_k) if causal else 0)
        assert sorted(n.tolist()) == sorted(want * (heads[0] * b))
    for tile in range(t.shape[0]):
        for p in range(3):
            h = t[tile, p]
            assert 0 <= h[kt.H_SMID] < sm_count(q.device)
            assert h[kt.H_GT_START] <= h[kt.H_GT_END]
            assert h[kt.H_CLK_START] <= h[kt.H_CLK_Q] <= h[kt.H_CLK_BLOCKS] <= h[kt.H_CLK_END], (tile, p)
            used = 8 if p < 2 else 3  # a producer stamps 3 events per block
            ev = h[kt.HEAD:kt.HEAD + kt.FORWARD.events * n[tile]].reshape(-1, kt.FORWARD.events)[:, :used]
            assert (np.diff(ev, axis=1) >= 0).all(), (tile, p)
            if p < 2 and n[tile]:  # a consumer's blocks one after the other, between Q and the end
                assert (ev[1:, 0] >= ev[:-1, -1]).all() and ev[0, 0] >= h[kt.H_CLK_Q], (tile, p)
                assert ev[-1, -1] <= h[kt.H_CLK_BLOCKS]
    pid, tile_i = t[:, 0, kt.H_PID], t[:, 0, kt.H_TILE_I]
    if config.PERSISTENT:
        assert pid.max() < min(t.shape[0], sm_count(q.device))
        per_cta = collections.defaultdict(list)
        for tile in range(t.shape[0]):
            per_cta[int(pid[tile])].append((tile, int(tile_i[tile])))
        for cta, tiles in per_cta.items():  # tiles cta, cta + CTAs, ..., numbered in that order
            assert [i for _t, i in sorted(tiles)] == list(range(len(tiles))), cta
    else:
        assert (pid == np.arange(t.shape[0])).all() and (tile_i == 0).all()



# ----------------------------------------------------------------------------------
# The dK/dV kernel (gluon/backward.py, trace.BACKWARD)
# ----------------------------------------------------------------------------------
B_ = GluonBwdConfig
BWD_CONFIGS = [B_(), B_(DQ_FUSED=1), B_(DQ_FUSED=2), B_(NUM_BUFFERS=3)]
BWD_CASES = [  # batch, (Hq, Hkv), n_q, n_k, head_dim, causal, dkdv_split
    (2, (8, 2), 1000, 1100, 128, True, 0),
    (1, (8, 1), 2048, 2048, 128, True, 4),  # a split: its CTAs' partials summed afterwards
    (2, (4, 4), 777, 1000, 64, False, 0),
]


def _bwd_case_id(c):
    return f"b{c[0]}h{c[1][0]}kv{c[1][1]}q{c[2]}k{c[3]}d{c[4]}{'-causal' if c[5] else ''}-split{c[6]}"


@pytest.mark.parametrize("case", BWD_CASES, ids=_bwd_case_id)
@pytest.mark.parametrize("config", BWD_CONFIGS, ids=lambda c: c.short())
def test_a_traced_backward_gives_the_untraced_bits_and_a_consistent_trace(config, case):
    _check_traced_backward(config, case)


@pytest.mark.parametrize("case", BWD_CASES, ids=_bwd_case_id)
@pytest.mark.parametrize("config", [B_(DQ_FUSED=1, DQ_FIRST=1), B_(DQ_FUSED=2, DQ_FIRST=1)], ids=lambda c: c.short())
def test_the_dq_share_first_keeps_the_traces_order(config, case):
    """DQ_FIRST stamps the dQ share's events around its own issue and wait (the issue of dV and
    dK inside "dQ: wgmma"): still in program order, still the untraced bits."""
    _check_traced_backward(config, case)


def _check_traced_backward(config, case):
    b, heads, n_q, n_k, d, causal, split = case
    q, k, v = _inputs(n_q, n_k, d, torch.bfloat16, heads=heads, batch=b, seed=9)
    do = torch.randn_like(q)
    o, lse2 = gluon_forward.gluon_attention_forward(q, k, v, default_gluon_config(d), causal=causal)
    kw = dict(causal=causal, dkdv_split=split)
    plain = gluon_backward.gluon_attention_backward(do, q, k, v, o, lse2, config, **kw)
    sink = []
    traced = gluon_backward.gluon_attention_backward(do, q, k, v, o, lse2, config, trace=sink, **kw)
    torch.cuda.synchronize()
    # dK and dV bit for bit; dQ too unless the fused dQ's reduce-adds land in another order
    assert torch.equal(plain[1], traced[1]) and torch.equal(plain[2], traced[2])
    if config.DQ_FUSED:
        torch.testing.assert_close(plain[0], traced[0], rtol=0, atol=1e-2)
    else:
        assert torch.equal(plain[0], traced[0])
    (trace, ) = sink
    t = trace.cpu()
    layout = kt.BACKWARD
    acc = kt.account(t, 0, sms=sm_count(q.device), layout=layout)
    assert sum(acc.consumer.values()) == pytest.approx(1.0)
    if not config.DQ_FUSED:
        # no dQ share: its four stamps back to back, each interval one clock read and one
        # store (25-40 cycles a block; their share of a consumer's time reaches 8 % on short
        # split rows, so the bound is per block)
        dq = {name: c for name, c in acc.block_phases.items() if name.startswith("dQ")}
        assert len(dq) == 4 and all(c < 150 for c in dq.values()), acc.block_phases
        assert sum(dq.values()) < 0.15 * acc.cycles_per_block, acc.block_phases
    n = t[:, 0, kt.H_N_BLOCKS]
    assert (t[:, 0, kt.H_PID] == torch.arange(t.shape[0])).all()
    for cta in range(t.shape[0]):
        for p in range(3):
            h = t[cta, p]
            assert h[kt.H_CLK_START] <= h[kt.H_CLK_Q] <= h[kt.H_CLK_BLOCKS] <= h[kt.H_CLK_END], (cta, p)
            used = layout.events if p < 2 else 3
            ev = h[kt.HEAD:kt.HEAD + layout.events * int(n[cta])].reshape(-1, layout.events)[:, :used]
            assert (ev.diff(dim=1) >= 0).all(), (cta, p)
            if p < 2 and n[cta]:
                assert (ev[1:, 0] >= ev[:-1, -1]).all() and ev[0, 0] >= h[kt.H_CLK_Q], (cta, p)
