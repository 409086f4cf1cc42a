"""Launch plans (kernels/launch.py): a signature's second call replays the first one's
recorded launches; its outputs must be bit-identical to the launchers run without plans,
for every kind of launch the launchers make (plain, split-KV with its combine, packed
grouped heads, TMA descriptors, a window, softcap, split dK/dV partials and their sum),
and signatures that differ in what the launchers read (strides, alignment, configs,
torch's deterministic mode) must never share a plan.

Runs under the interpreter on the CPU (fp32) and, marked ``gpu``, on CUDA (bf16/fp16)."""

from __future__ import annotations

import pytest
import torch

from flashtune.kernels import BwdConfig, FwdConfig, attention, attention_backward, attention_forward
from flashtune.kernels import passes as bw
from flashtune.kernels import passes as fw
from flashtune.kernels import launch
from flashtune.kernels.launch import Plan

F, B = FwdConfig, BwdConfig
CUDA = torch.cuda.is_available()


def _device_dtype(gpu: bool):
    if gpu:
        return torch.device("cuda"), torch.bfloat16
    return torch.device("cpu"), torch.float32


def _inputs(shape_q, shape_k, *, device, dtype, seed=0, transposed=False):
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def make(shape):
        if transposed:  # (B, N, H, D) storage seen as (B, H, N, D)
            b, h, n, d = shape
            return torch.randn((b, n, h, d), generator=gen).to(device=device, dtype=dtype).transpose(1, 2)
        return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    return make(shape_q), make(shape_k), make(shape_k)


def _train(q, k, v, do, **kw):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = attention(q, k, v, **kw)
    return (o, *torch.autograd.grad(o, (q, k, v), do))


def _without_plans(monkeypatch, fn):
    with monkeypatch.context() as m:
        m.setattr(launch, "ENABLED", False)
        return fn()


def _assert_identical(got, want, what):
    # the fused dQ's reduce-adds land in any order: its dQ is close, the rest identical
    unordered = ("dq",) if "fused" in what else ()
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, want):
        assert a.shape == b.shape and a.stride() == b.stride(), f"{what}: {name} layout"
        if name in unordered:
            torch.testing.assert_close(a, b, atol=2e-2, rtol=0, msg=f"{what}: {name}")
            continue
        assert torch.equal(a, b), f"{what}: {name} differs from the launcher without plans " \
                                  f"(max {(a.float() - b.float()).abs().max().item():.3g})"


def _cases(gpu: bool):
    d = 64 if gpu else 16
    n, nk = (300, 517) if gpu else (37, 53)
    blocks = (64, 64) if gpu else (16, 16)
    fb = F(blocks[0], blocks[1], 4, 2 if gpu else 1)
    bb = B(*blocks, *blocks, 4, 2 if gpu else 1)
    return [
        # name, q shape, k shape, attention kwargs
        ("plain", (2, 4, n, d), (2, 2, nk, d), dict(causal=False, fwd_config=fb, bwd_config=bb)),
        ("causal bottom-right", (1, 4, n, d), (1, 1, nk, d),
         dict(causal=True, causal_align="bottom_right", fwd_config=fb, bwd_config=bb)),
        ("defaults", (2, 3, n, d), (2, 3, n, d), dict(causal=True)),
        ("split-KV + combine, packed heads", (2, 8, 1, d), (2, 2, 4 * nk, d),
         dict(fwd_config=F(blocks[0], blocks[1], 4, 1, num_splits=3, pack_gqa=1), bwd_config=bb)),
        ("split-KV decode, unpacked", (1, 4, 3, d), (1, 4, 4 * nk, d),
         dict(causal=True, causal_align="bottom_right", fwd_config=F(blocks[0], blocks[1], 4, 1, num_splits=2,
                                                                     pack_gqa=0), bwd_config=bb)),
        ("TMA descriptors", (1, 2, n, d), (1, 2, nk, d),  # fp16 on the CPU: TMA needs 2-byte elements
         dict(half=True, causal=True, fwd_config=F(blocks[0], blocks[1], 4, 1, tma=1), bwd_config=B(*blocks, *blocks, 4, 1,
                                                                                           tma=1))),
        ("window + softcap", (1, 2, n, d), (1, 2, n, d),
         dict(causal=True, window_size=(n // 3, 0), softcap=20.0, fwd_config=fb, bwd_config=bb)),
        ("split dK/dV partials", (1, 8, n, d), (1, 1, n, d),
         dict(causal=True, fwd_config=fb, bwd_config=B(*blocks, *blocks, 4, 1, dkdv_split=4))),
    ] + (_gluon_cases(n, d) if gpu and torch.cuda.get_device_capability() == (9, 0) else [])


def _gluon_cases(n: int, d: int) -> list:
    """The Gluon families (sm_90): their forward, and each backward family, split and fused."""
    gf = F(64, 128, 4, 3, family=1)
    return [
        ("gluon fwd + bwd family 1, split", (1, 8, n, d), (1, 2, n, d),
         dict(causal=True, fwd_config=gf, bwd_config=B(64, 64, 128, 64, 4, 2, 8, 3, family=1, dkdv_split=4))),
        ("gluon bwd family 2", (2, 4, n, d), (2, 4, n, d),
         dict(causal=False, fwd_config=gf, bwd_config=B(64, 64, 64, 64, 4, 2, family=2))),
        ("gluon fused dQ (zeroed buffer, copy)", (2, 4, n, d), (2, 2, n, d),
         dict(causal=True, fwd_config=gf, bwd_config=B(64, 64, 64, 64, 4, 2, family=3))),
        ("gluon fused dQ late", (1, 4, n, d), (1, 4, n, d),
         dict(causal=False, fwd_config=gf, bwd_config=B(64, 64, 64, 64, 4, 2, family=4))),
        # head dim 256: the D=256 Gluon dK/dV kernel (gluon/backward_wide.py), dQ fused, and with the Triton dQ
        # kernel and the split's partials
        ("gluon D=256 fused dQ", (1, 4, n, 256), (1, 2, n, 256),
         dict(causal=True, fwd_config=F(64, 64, 4, 2, family=1), bwd_config=B(32, 64, 64, 64, 4, 3, family=3))),
        ("gluon D=256 family 1, split", (1, 8, n, 256), (1, 1, n, 256),
         dict(causal=False, fwd_config=F(64, 64, 4, 2, family=1),
              bwd_config=B(32, 64, 64, 64, 4, 2, 4, 2, family=1, dkdv_split=4))),
    ]


def _check_cases(monkeypatch, gpu: bool):
    device, dtype = _device_dtype(gpu)
    fw._FWD_PLANS.clear()
    bw._BWD_PLANS.clear()
    for name, shape_q, shape_k, kw in _cases(gpu):
        dtype = torch.float16 if kw.pop("half", False) and not gpu else _device_dtype(gpu)[1]
        q, k, v = _inputs(shape_q, shape_k, device=device, dtype=dtype)
        do = torch.randn(shape_q, generator=torch.Generator().manual_seed(1)).to(device=device, dtype=dtype)
        want = _without_plans(monkeypatch, lambda: _train(q, k, v, do, **kw))
        first = _train(q, k, v, do, **kw)  # records
        _assert_identical(first, want, f"{name}, recording call")
        for seed in (2, 3):  # replays, on new data of the same signature
            q2, k2, v2 = _inputs(shape_q, shape_k, device=device, dtype=dtype, seed=seed)
            got = _train(q2, k2, v2, do, **kw)
            want2 = _without_plans(monkeypatch, lambda: _train(q2, k2, v2, do, **kw))
            _assert_identical(got, want2, f"{name}, replay {seed}")
            assert got[0].data_ptr() != first[0].data_ptr() or not first[0].is_cuda, "replay reused an output"
    plans = list(fw._FWD_PLANS.values()) + list(bw._BWD_PLANS.values())
    assert plans and all(isinstance(p, Plan) for p in plans), "every case above is plannable"
    assert all(p.replays >= 2 for p in plans), f"plans made but not replayed: {[p.replays for p in plans]}"
    kinds = {len(p.launches) for p in fw._FWD_PLANS.values()}
    assert {1, 2} <= kinds, f"plain and split+combine forwards recorded, got launch counts {kinds}"
    assert any(len(p.launches) == 4 for p in bw._BWD_PLANS.values()), "a backward with the partials' sum"
    assert any(ref[0] == "desc" for p in plans for ln in p.launches for _, ref in ln.refs), "TMA descriptors"
    assert any(ref[0] == "view" for p in plans for ln in p.launches for _, ref in ln.refs), "views of partials"
    if any(name.startswith("gluon") for name, *_ in _cases(gpu)):
        assert any(ref[0] == "desc" and "gluon" in ref[3].__module__
                   for p in plans for ln in p.launches for _, ref in ln.refs), "Gluon descriptors"
        # the fused dQ: its fp32 buffer zeroed by the kernel that computes Delta (no zero_ step since
        # 2026-12-05), then cast into dQ by a copy
        assert any(".copy_(" in p.source and ".zero_()" not in p.source for p in bw._BWD_PLANS.values()), "fused dQ"


@pytest.mark.skipif(CUDA, reason="the interpreter's CPU run; the GPU run is test_replay_matches_launchers_gpu")
def test_replay_matches_launchers(monkeypatch):
    _check_cases(monkeypatch, gpu=False)


@pytest.mark.gpu
def test_replay_matches_launchers_gpu(monkeypatch):
    _check_cases(monkeypatch, gpu=True)


def _device():
    return _device_dtype(CUDA)


def test_signature_parts_keep_plans_apart(monkeypatch):
    """Strides, the data pointer's alignment, configs and the causal flag each get their own
    plan, and each serves the right answer."""
    device, dtype = _device()
    fw._FWD_PLANS.clear()
    d = 64 if CUDA else 16
    shape = (1, 2, 29, d)
    cfg = F(16, 16, 4, 1)
    variants = {
        "contiguous": _inputs(shape, shape, device=device, dtype=dtype),
        "transposed": _inputs(shape, shape, device=device, dtype=dtype, transposed=True),
    }
    base = torch.randn(shape[0] * shape[1] * shape[2] * d + 1).to(device=device, dtype=dtype)
    unaligned = base[1:].view(shape)  # 4 bytes off a 16-byte boundary
    assert unaligned.data_ptr() % 16
    variants["unaligned"] = (unaligned, *_inputs(shape, shape, device=device, dtype=dtype)[1:])
    for causal in (False, True):
        for config in (cfg, F(32, 16, 4, 1)):
            for name, (q, k, v) in variants.items():
                for _ in range(2):
                    got = attention_forward(q, k, v, config, causal=causal, sm_scale=0.3)
                    want = _without_plans(monkeypatch, lambda: attention_forward(q, k, v, config, causal=causal,
                                                                                 sm_scale=0.3))
                    for a, b in zip(got, want):
                        assert torch.equal(a, b), f"{name}, causal={causal}, {config}"
    assert len(fw._FWD_PLANS) == 2 * 2 * 3


def test_unplannable_calls_run_the_launchers(monkeypatch):
    """Atomic dQ (a zeroed buffer and a copy) and torch's deterministic switch: no plan is
    kept for the first, the switch is part of the signature; answers stay right."""
    device, dtype = _device()
    bw._BWD_PLANS.clear()
    d = 64 if CUDA else 16
    q, k, v = _inputs((1, 2, 40, d), (1, 2, 40, d), device=device, dtype=dtype)
    do = torch.randn_like(q)
    cfg = B(16, 16, 16, 16, 4, 1, atomic_dq=1)
    o, lse2 = attention_forward(q, k, v, F(16, 16, 4, 1), causal=True, sm_scale=0.25)
    for deterministic in (False, True, False):
        monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: deterministic)
        for _ in range(2):
            got = attention_backward(do, q, k, v, o, lse2, cfg, causal=True, sm_scale=0.25)
            want = _without_plans(monkeypatch, lambda: attention_backward(do, q, k, v, o, lse2, cfg, causal=True,
                                                                         sm_scale=0.25))
            # atomic adds may sum in any order: close, not identical
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, atol=1e-5 if dtype == torch.float32 else 2e-2, rtol=0)
    kept = {key[7]: plan for key, plan in bw._BWD_PLANS.items()}
    assert kept[False] is False, "the atomic dQ call must not be replayed from a plan"
    assert isinstance(kept[True], Plan), "deterministic mode runs the dQ kernel: plannable"


def test_aliased_inputs_are_not_recorded(monkeypatch):
    """attention(x, x, x) passes one tensor three times: a plan recorded from it would not
    know which argument is which, so none is kept; a later call with three tensors is."""
    device, dtype = _device()
    fw._FWD_PLANS.clear()
    d = 64 if CUDA else 16
    x, k, v = _inputs((1, 2, 33, d), (1, 2, 33, d), device=device, dtype=dtype)
    cfg = F(16, 16, 4, 1)
    for _ in range(2):
        got = attention_forward(x, x, x, cfg, causal=False, sm_scale=0.2)
    assert not fw._FWD_PLANS
    want = _without_plans(monkeypatch, lambda: attention_forward(x, x, x, cfg, causal=False, sm_scale=0.2))
    assert torch.equal(got[0], want[0])
    for _ in range(2):
        got = attention_forward(x, k, v, cfg, causal=False, sm_scale=0.2)
    assert len(fw._FWD_PLANS) == 1
    want = _without_plans(monkeypatch, lambda: attention_forward(x, k, v, cfg, causal=False, sm_scale=0.2))
    assert torch.equal(got[0], want[0])


def test_zero_fills_copies_and_gluon_descriptors_are_replayed():
    """``launch.zeros`` and ``launch.copy_`` are steps of a plan, replayed in the recorded
    order between the launches (the fused-dQ Gluon backward zeroes an fp32 buffer, its
    kernel adds into it, a copy casts it); a Gluon TensorDescriptor
    argument (the Gluon kernels' tiles, dK and dV through TMA over the plan's own outputs) is
    recorded by its class and rebuilt over the replay's tensor."""
    import triton
    import triton.language as tl

    @triton.jit
    def add_into(X, ACC, N: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(ACC + offs, tl.load(ACC + offs) + 2.0 * tl.load(X + offs))

    device = torch.device("cuda" if CUDA else "cpu")

    def run(x):
        acc = launch.zeros((16,), dtype=torch.float32, device=device)
        launch.launch(add_into, x, acc, grid=(1,), N=16)
        return (launch.copy_(launch.empty((16,), dtype=torch.float16, device=device), acc), )

    cache = {}
    for seed in range(3):
        x = torch.randn(16, generator=torch.Generator().manual_seed(seed)).to(device)
        (got, ) = launch.planned(cache, ("k",), (x,), lambda: run(x))
        assert torch.equal(got, (2.0 * x).half()), f"call {seed}"
    plan = cache[("k",)]
    assert isinstance(plan, Plan) and plan.replays == 2
    assert ".zero_()" in plan.source and ".copy_(" in plan.source
    assert plan.source.index(".zero_()") < plan.source.index(".copy_("), plan.source

    pytest.importorskip("triton.experimental.gluon")
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

    from flashtune.kernels.gluon.sm90 import tile_layout

    x = torch.zeros(2, 32, 16, dtype=torch.float16)
    desc = GluonDescriptor(x, list(x.shape), list(x.stride()), [1, 16, 16], tile_layout(16, 16, torch.float16))
    ref = launch._Recorder((x,)).ref(desc)
    assert ref[0] == "desc" and ref[1] == ("slot", 0) and ref[3] is GluonDescriptor
    y = torch.ones_like(x)
    again = launch._descriptor(ref[3], ref[2], y)
    assert type(again) is GluonDescriptor and again.base is y
    assert (again.shape, again.strides, again.block_shape, again.layout) == \
        (desc.shape, desc.strides, desc.block_shape, desc.layout)
