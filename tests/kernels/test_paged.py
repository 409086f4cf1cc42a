"""attention_kvcache: decode queries against a contiguous or a paged (block-table) K/V cache
with per-sequence lengths, against an independent reference (kernel_checks.py's rule).

The reference gathers each sequence's keys out of the cache with plain torch indexing
(through the block table for pages; the gather is checked against the values the test
wrote) and runs reference_attention on that sequence alone, causal aligned bottom-right,
in float64 (the truth), in the input's dtype (the baseline) and in float32 (the
log-sum-exp's baseline). Every cache entry no sequence uses holds NaN (unused pages, rows
past a length in its last page or slice, the head-dim padding of the strided layout), and
block-table entries past a sequence's pages hold out-of-range indices, so a read of any of
them shows in the output. Runs under Triton's interpreter on the CPU (fp32 and fp16; bf16
is refused there) and on CUDA when there is one; the real-size bf16 case is marked gpu.
"""

from __future__ import annotations

import dataclasses
import math
import zlib

import pytest
import torch

import flashtune.device
from kernel_checks import DTYPES, assert_close_to_reference, tolerance

import flashtune
from flashtune.kernels import FwdConfig, attention_kvcache, launch, reference_attention
from flashtune.kernels.triton import decode
from flashtune.kernels import kvcache
from flashtune.kernels.triton.decode import kvcache_schedule
from flashtune.tolerance import baseline_dtype, uses_tf32

F = FwdConfig
# block-table entries past a sequence's pages: never read (the kernel would fault or read NaN)
UNUSED_ENTRIES = (-1, 2**30)


@dataclasses.dataclass(frozen=True)
class KVCase:
    dtype: str
    n_q: int
    lens: tuple[int, ...]
    heads: tuple[int, int]  # (Hq, Hkv)
    head_dim: int
    page_size: int | None  # None: a contiguous (B, Hkv, capacity, D) cache
    capacity: int  # keys per sequence (paged: max_pages x page_size)
    causal: bool = False
    fwd: FwdConfig | None = None
    window: tuple[int, int] | None = None
    softcap: float | None = None
    strided: bool = False  # q in FlashAttention's (B, Nq, H, D) storage, caches padded along D
    max_seqlen_k: int | None = None
    spare_pages: int = 3

    def __str__(self) -> str:
        hq, hkv = self.heads
        parts = [self.dtype, f"q{self.n_q}", "lens" + ".".join(map(str, self.lens)), f"h{hq}kv{hkv}",
                 f"d{self.head_dim}", f"page{self.page_size}x{self.capacity // self.page_size}" if self.page_size
                 else f"dense{self.capacity}", "causal" if self.causal else "full"]
        if self.fwd is not None:
            parts.append(f"{self.fwd.BLOCK_M}x{self.fwd.BLOCK_N}split{self.fwd.num_splits}pack{self.fwd.pack_gqa}")
        for name in ("window", "softcap", "max_seqlen_k"):
            if getattr(self, name) is not None:
                parts.append(f"{name}{getattr(self, name)}")
        if self.strided:
            parts.append("strided")
        return "-".join(parts)


@dataclasses.dataclass
class KVInputs:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    cache_seqlens: torch.Tensor
    block_table: torch.Tensor | None
    keys: list  # per sequence (Hkv, L, D), as written into the cache (in the cache's dtype)
    values: list


def kv_inputs(case: KVCase, device) -> KVInputs:
    """Random q and a cache holding each sequence's keys and values (standard normal, seeded
    by the case's name), NaN everywhere else; pages assigned in a shuffled order."""
    gen = torch.Generator().manual_seed(zlib.crc32(str(case).encode()))
    dtype = DTYPES[case.dtype][0]
    hq, hkv = case.heads
    B, D, ps = len(case.lens), case.head_dim, case.page_size
    pad = 8 if case.strided else 0
    q = torch.randn(B, case.n_q, hq, D, generator=gen).transpose(1, 2) if case.strided \
        else torch.randn(B, hq, case.n_q, D, generator=gen)
    keys = [torch.randn(hkv, n, D, generator=gen) for n in case.lens]
    values = [torch.randn(hkv, n, D, generator=gen) for n in case.lens]
    table = None
    if ps is None:
        kc = torch.full((B, hkv, case.capacity, D + pad), math.nan)
        vc = torch.full_like(kc, math.nan)
        for b, n in enumerate(case.lens):
            kc[b, :, :n, :D], vc[b, :, :n, :D] = keys[b], values[b]
    else:
        assert case.capacity % ps == 0
        used = [-(-n // ps) for n in case.lens]
        n_pages = sum(used) + case.spare_pages
        order = torch.randperm(n_pages, generator=gen).tolist()
        kc = torch.full((n_pages, ps, hkv, D + pad), math.nan)
        vc = torch.full_like(kc, math.nan)
        table = torch.empty(B, case.capacity // ps, dtype=torch.int32)
        for b in range(B):
            table[b] = UNUSED_ENTRIES[b % 2]
        for b, n in enumerate(case.lens):
            for i in range(used[b]):
                page = order.pop()
                table[b, i] = page
                rows = min(ps, n - i * ps)
                kc[page, :rows, :, :D] = keys[b][:, i * ps:i * ps + rows].transpose(0, 1)
                vc[page, :rows, :, :D] = values[b][:, i * ps:i * ps + rows].transpose(0, 1)
        table = table.to(device)
    kc, vc = (x.to(device=device, dtype=dtype)[..., :D] for x in (kc, vc))
    lens = torch.tensor(case.lens, dtype=torch.int32, device=device)
    keys, values = ([x.to(device=device, dtype=dtype) for x in xs] for xs in (keys, values))
    return KVInputs(q.to(device=device, dtype=dtype), kc, vc, lens, table, keys, values)


def gather(cache: torch.Tensor, b: int, n: int, table: torch.Tensor | None) -> torch.Tensor:
    """Sequence b's first n rows of a cache as (Hkv, n, D), by plain indexing."""
    if table is None:
        return cache[b, :, :n]
    pos = torch.arange(n, device=cache.device)
    return cache[table[b, pos // cache.shape[1]].long(), pos % cache.shape[1]].transpose(0, 1)


def loop_reference(inp: KVInputs, case: KVCase, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse) of reference_attention on each sequence's gathered keys, in ``dtype``; a
    sequence without keys gets o 0, lse -inf."""
    outs, lses = [], []
    B, hq, n_q, D = inp.q.shape
    for b, n in enumerate(case.lens):
        if n == 0:
            outs.append(torch.zeros(1, hq, n_q, D, dtype=dtype, device=inp.q.device))
            lses.append(torch.full((1, hq, n_q), -math.inf, dtype=dtype, device=inp.q.device))
            continue
        k, v = (gather(c, b, n, inp.block_table) for c in (inp.k_cache, inp.v_cache))
        o, lse = reference_attention(inp.q[b:b + 1], k[None], v[None], causal=case.causal, dtype=dtype,
                                     causal_align="bottom_right", window_size=case.window, softcap=case.softcap)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def check_kvcache(case: KVCase, device, **kwargs) -> dict:
    inp = kv_inputs(case, device)
    for b, n in enumerate(case.lens):  # the reference's gather finds what was written
        assert torch.equal(gather(inp.k_cache, b, n, inp.block_table), inp.keys[b])
        assert torch.equal(gather(inp.v_cache, b, n, inp.block_table), inp.values[b])
    dtype, precision = DTYPES[case.dtype]
    o, lse = attention_kvcache(inp.q, inp.k_cache, inp.v_cache, inp.cache_seqlens, block_table=inp.block_table,
                               causal=case.causal, fwd_config=case.fwd, return_lse=True, fp32_precision=precision,
                               window_size=case.window, softcap=case.softcap, max_seqlen_k=case.max_seqlen_k,
                               **kwargs)
    B, hq, n_q, _ = inp.q.shape
    assert o.shape == inp.q.shape and o.dtype == inp.q.dtype and o.stride() == inp.q.stride()
    assert lse.shape == (B, hq, n_q) and lse.dtype == torch.float32
    truth = loop_reference(inp, case, torch.float64)
    low = loop_reference(inp, case, baseline_dtype(dtype, tf32=uses_tf32(dtype, device, precision)))
    lse32 = low[1] if low[0].dtype == torch.float32 else loop_reference(inp, case, torch.float32)[1]
    empty = torch.isneginf(truth[1])
    assert torch.equal(torch.isneginf(lse), empty), "lse: -inf exactly on the rows that see no key"
    assert (o.masked_select(empty[..., None]) == 0).all(), "o: 0 on the rows that see no key"
    tol = tolerance(case.dtype, device)
    return {"lse": assert_close_to_reference("lse", *(x.masked_fill(empty, 0.0) for x in (lse, truth[1], lse32)),
                                             tol=tol, lse=True),
            "o": assert_close_to_reference("o", o, truth[0], low[0], tol=tol)}


def _cases() -> list[KVCase]:
    return [
        # gather per row (page 16 < BLOCK_N 32), lengths 0, 1, not a block multiple and full;
        # 3 chunks over 2 key blocks: the third empty for every sequence
        KVCase("fp32-ieee", 1, (0, 1, 37, 64), (4, 4), 64, 16, 64, fwd=F(16, 32, 4, 1, num_splits=3)),
        # one table entry per tile (page 32 = 2 x BLOCK_N 16), GQA 4, D 40, causal Nq 3
        KVCase("fp16", 3, (5, 64, 33), (8, 2), 40, 32, 64, causal=True, fwd=F(16, 16, 4, 1, num_splits=4)),
        # a page size that is no power of two (24, gathered per row), MQA group 8, D 96, Nq 16
        # causal with a sequence shorter than the queries (its first rows see no key)
        KVCase("fp32-ieee", 16, (16, 70, 3), (8, 1), 96, 24, 72, causal=True,
               fwd=F(16, 16, 4, 1, num_splits=2, pack_gqa=1)),
        # a contiguous cache, auto schedule, MQA, lengths full / 0 / odd
        KVCase("fp16", 1, (100, 0, 49), (8, 1), 64, None, 100, fwd=F(16, 16, 4, 1)),
        # contiguous, causal Nq 3, 5 chunks of 16 keys over 50: empty chunks, unpacked MQA
        KVCase("fp32-ieee", 3, (1, 50), (4, 1), 40, None, 50, causal=True, fwd=F(16, 16, 4, 1, num_splits=5,
                                                                                  pack_gqa=0)),
        # pages of 64 = 2 x BLOCK_N, GQA 8 packed Nq 16 (128 rows in 16-row blocks), one chunk
        KVCase("fp16", 16, (31, 64), (16, 2), 64, 64, 128, fwd=F(16, 32, 4, 1, num_splits=1, pack_gqa=1)),
        # the default config (BLOCK_N above the page size), MHA
        KVCase("fp32-ieee", 1, (0, 17, 160), (2, 2), 64, 16, 160),
        # FlashAttention's q layout, caches padded along D (strided, NaN padding), page 1
        KVCase("fp32-ieee", 2, (9, 4), (4, 2), 40, 1, 12, causal=True, strided=True,
               fwd=F(16, 16, 4, 1, num_splits=2)),
        KVCase("fp16", 3, (20, 7), (4, 2), 64, None, 24, strided=True, fwd=F(16, 16, 4, 1, num_splits=3)),
        # more queries than a decode step (the split kernel with one chunk, several row blocks)
        KVCase("fp32-ieee", 20, (25, 40), (2, 2), 64, 16, 48, causal=True, fwd=F(16, 16, 4, 1)),
        # a window and a softcap, bottom-right in each sequence
        KVCase("fp32-ieee", 3, (50, 12), (4, 2), 64, 16, 64, causal=True, window=(20, 0),
               fwd=F(16, 16, 4, 1, num_splits=3)),
        KVCase("fp16", 2, (45, 0, 30), (4, 1), 64, 32, 64, softcap=5.0, fwd=F(16, 16, 4, 1, num_splits=2)),
        # a large cache holding short sequences: auto chunks sized for max_seqlen_k
        KVCase("fp32-ieee", 1, (10, 20), (4, 2), 64, 16, 512, max_seqlen_k=20, fwd=F(16, 16, 4, 1, num_splits=0)),
    ]


@pytest.mark.parametrize("case", _cases(), ids=str)
def test_kvcache_against_reference(case, kernel_device):
    check_kvcache(case, kernel_device)


def test_the_cases_cover_what_they_claim():
    """The matrix's schedules: the gathered and one-entry tile paths both run, and some
    splits leave chunks empty for a sequence (or every sequence)."""
    cpu = torch.device("cpu")
    cases = _cases()
    block_n = [(c.fwd or flashtune.kernels.default_config("fwd", c.head_dim, DTYPES[c.dtype][0], "cpu",
                                                          causal=c.causal, seq_q=1)).BLOCK_N for c in cases]
    paged = [(c.page_size, n) for c, n in zip(cases, block_n) if c.page_size]
    assert any(ps % n == 0 for ps, n in paged) and any(ps % n for ps, n in paged)
    empty_chunks = 0
    for c in cases:
        if c.fwd is None:
            continue
        s = kvcache_schedule(c.fwd, len(c.lens), *c.heads, c.n_q, c.max_seqlen_k or c.capacity, cpu)
        empty_chunks += sum(s.splits - -(-n // s.chunk) for n in c.lens)
    assert empty_chunks > 0
    assert {c.heads[0] // c.heads[1] for c in cases} >= {1, 4, 8} and any(c.heads[1] == 1 for c in cases)
    assert {c.n_q for c in cases} >= {1, 3, 16} and {c.head_dim for c in cases} >= {64, 40, 96}


def test_max_seqlen_k_sizes_the_auto_chunks(monkeypatch):
    monkeypatch.setattr(flashtune.device, "INTERPRETER_SCHEDULE_SMS", 132)
    cpu, cfg = torch.device("cpu"), F(64, 128, 4, 2)
    full = kvcache_schedule(cfg, 1, 32, 8, 1, 131072, cpu)
    short = kvcache_schedule(cfg, 1, 32, 8, 1, 2048, cpu)
    assert full.splits * full.chunk >= 131072 and short.splits * short.chunk >= 2048
    assert short.chunk * short.splits < 131072 and short.splits <= 2048 // decode.MIN_CHUNK_KEYS
    # where plan_schedule would run the plain forward: the split kernel, one chunk over every key
    plain = kvcache_schedule(dataclasses.replace(cfg, num_splits=1, pack_gqa=0), 64, 32, 32, 40, 1000, cpu)
    assert decode.plan_schedule(dataclasses.replace(cfg, num_splits=1, pack_gqa=0), 64, 32, 32, 40, 1000, cpu) is None
    assert (plain.splits, plain.pack, plain.block_m) == (1, False, 64) and plain.chunk >= 1000


def test_launch_plans_replay_with_new_lengths_and_pages(kernel_device):
    """A second call of the same signature replays its plan and reads the new lengths and
    block table (the kernels read them; nothing about their values is recorded)."""
    case = KVCase("fp32-ieee", 2, (30, 7), (4, 2), 64, 16, 48, causal=True, fwd=F(16, 16, 4, 1, num_splits=2))
    other = dataclasses.replace(case, lens=(3, 48), spare_pages=2)  # as many pages (6) as case's
    assert kv_inputs(case, kernel_device).k_cache.shape == kv_inputs(other, kernel_device).k_cache.shape
    kvcache._KVCACHE_PLANS.clear()
    check_kvcache(case, kernel_device)
    plans = list(kvcache._KVCACHE_PLANS.values())
    if not launch.ENABLED:
        pytest.skip("launch plans are off (FLASHTUNE_LAUNCH_PLANS=0)")
    assert len(plans) == 1 and isinstance(plans[0], launch.Plan) and plans[0].replays == 0
    check_kvcache(other, kernel_device)
    assert len(kvcache._KVCACHE_PLANS) == 1 and plans[0].replays == 1


def test_length_zero_everywhere(kernel_device):
    inp = kv_inputs(KVCase("fp16", 4, (0, 0), (4, 2), 64, 16, 32), kernel_device)
    for splits in (1, 3):
        o, lse = attention_kvcache(inp.q, inp.k_cache, inp.v_cache, inp.cache_seqlens, block_table=inp.block_table,
                                   causal=True, return_lse=True, fwd_config=F(16, 16, 4, 1, num_splits=splits))
        assert (o == 0).all() and torch.isneginf(lse).all()


def test_inference_only(kernel_device):
    inp = kv_inputs(KVCase("fp32-ieee", 1, (5,), (2, 2), 64, None, 16), kernel_device)
    q = inp.q.clone().requires_grad_()
    with pytest.raises(ValueError, match="q: requires grad, but attention_kvcache is inference only"):
        attention_kvcache(q, inp.k_cache, inp.v_cache, inp.cache_seqlens)
    k = inp.k_cache.clone().requires_grad_()
    with pytest.raises(ValueError, match="k_cache: requires grad"):
        attention_kvcache(inp.q, k, inp.v_cache, inp.cache_seqlens)
    with torch.no_grad():
        o = attention_kvcache(q, k, inp.v_cache, inp.cache_seqlens)
    assert not o.requires_grad
    assert flashtune.attention_kvcache is attention_kvcache


# ----------------------------------------------------------------------------------
# Errors: each names the argument
# ----------------------------------------------------------------------------------
def _error_cases():
    i32 = torch.int32

    def paged(**change):
        return dict(dict(q=(2, 4, 1, 64), kc=(10, 16, 2, 64), lens=[3, 40], table=(2, 4)), **change)

    def dense(**change):
        return dict(dict(q=(2, 4, 1, 64), kc=(2, 2, 48, 64), lens=[3, 40], table=None), **change)

    return [
        (dense(lens_dtype=torch.int64), TypeError, "cache_seqlens: expected dtype int32, got torch.int64"),
        (paged(table_dtype=torch.int64), TypeError, "block_table: expected dtype int32, got torch.int64"),
        (dense(lens=None), TypeError, "cache_seqlens: expected a torch.Tensor of int32"),
        (dense(lens=[3, 40, 5]), ValueError, "cache_seqlens: expected one length per sequence, 2"),
        (dense(lens_2d=True), ValueError, r"cache_seqlens: expected a 1-D tensor"),
        (paged(table=(3, 4)), ValueError, "block_table: expected one row per sequence, 2"),
        (paged(table=(2, 0)), ValueError, "block_table: expected at least one page per sequence"),
        (paged(table_1d=True), ValueError, "block_table: expected a 2-D tensor"),
        (dense(kc=(3, 2, 48, 64)), ValueError, "k_cache: expected batch 2 like q"),
        (dense(kc=(2, 3, 48, 64)), ValueError, r"k_cache: the number of query heads \(4\) must be a multiple"),
        (paged(kc=(10, 16, 3, 64)), ValueError, r"k_cache: the number of query heads \(4\) must be a multiple"),
        (dense(kc=(2, 2, 48, 32)), ValueError, "k_cache: expected head_dim 64 like q"),
        (dense(kc=(2, 48, 64)), ValueError, r"k_cache: expected a 4-D tensor \(batch, heads_kv, capacity"),
        (paged(kc=(10, 16, 2, 64), vc=(10, 8, 2, 64)), ValueError, "v_cache: expected the shape of k_cache"),
        (paged(kc=(10, 0, 2, 64)), ValueError, "k_cache: expected a non-empty tensor"),
        (dense(kc_dtype=torch.float16), TypeError, r"k_cache: expected the dtype of q \(torch.float32\)"),
        (dense(vc_dtype=torch.float16), TypeError, r"v_cache: expected the dtype of q"),
        (dense(kc_device="meta"), ValueError, r"k_cache: expected the device of q \(cpu\), got meta"),
        (dense(lens_device="meta"), ValueError, r"cache_seqlens: expected the device of q \(cpu\), got meta"),
        (paged(table_device="meta"), ValueError, r"block_table: expected the device of q \(cpu\), got meta"),
        (dense(q_dtype=torch.bfloat16, kc_dtype=torch.bfloat16, vc_dtype=torch.bfloat16), TypeError,
         "q: bfloat16 is not computed correctly by the Triton interpreter"),
        # values (check=True): lengths past the capacity, negative, past max_seqlen_k; pages out of range
        (dense(lens=[3, 49]), ValueError, r"cache_seqlens: expected lengths in \[0, 48\] \(the cache's capacity, "
                                          r"k_cache.shape\[2\]\), got 49 at index 1"),
        (paged(lens=[65, 2]), ValueError, r"cache_seqlens: expected lengths in \[0, 64\] \(the cache's capacity, "
                                          r"block_table.shape\[1\] x page_size\), got 65 at index 0"),
        (paged(lens=[-1, 2]), ValueError, r"cache_seqlens: expected lengths in \[0, 64\].*got -1 at index 0"),
        (paged(max_seqlen_k=30), ValueError, r"cache_seqlens: expected lengths in \[0, 30\] \(max_seqlen_k\), "
                                             r"got 40 at index 1"),
        (paged(max_seqlen_k=65), ValueError, r"max_seqlen_k: expected an int in \[0, 64\]"),
        (paged(max_seqlen_k=3.0), TypeError, "max_seqlen_k: expected an int or None, got float"),
        (paged(bad_page=(1, 2, 10)), ValueError, r"block_table: expected page indices in \[0, 10\) "
                                                 r"\(k_cache.shape\[0\]\) for the 3 pages sequence 1 uses.*"
                                                 r"got 10 at \[1, 2\]"),
        (paged(bad_page=(0, 0, -1)), ValueError, r"block_table: .*got -1 at \[0, 0\]"),
        (paged(check="yes"), TypeError, "check: expected a bool, got str"),
        (dense(causal=1), TypeError, "causal: expected a bool"),
        (dense(q=(2, 4, 64)), ValueError, "q: expected a 4-D tensor"),
    ]


def _build(spec):
    q_dtype = spec.get("q_dtype", torch.float32)
    q = torch.randn(*spec["q"], dtype=q_dtype)
    kc = torch.randn(*spec["kc"], dtype=spec.get("kc_dtype", q_dtype), device=spec.get("kc_device", "cpu"))
    vc = torch.randn(*spec.get("vc", spec["kc"]), dtype=spec.get("vc_dtype", q_dtype))
    lens = spec["lens"]
    if lens is not None:
        lens = torch.tensor(lens, dtype=spec.get("lens_dtype", torch.int32), device=spec.get("lens_device", "cpu"))
        if spec.get("lens_2d"):
            lens = lens[:, None]
    table = spec["table"]
    if table is not None:
        n_pages = spec["kc"][0]
        table = (torch.arange(table[0] * table[1]) % n_pages).view(*table)
        table = table.to(dtype=spec.get("table_dtype", torch.int32), device=spec.get("table_device", "cpu"))
        if "bad_page" in spec:
            b, i, value = spec["bad_page"]
            table[b, i] = value
        if spec.get("table_1d"):
            table = table[0]
    kwargs = {name: spec[name] for name in ("max_seqlen_k", "check", "causal") if name in spec}
    return (q, kc, vc, lens), dict(block_table=table, **kwargs)


@pytest.mark.parametrize(("spec", "error", "match"), _error_cases(),
                         ids=[f"{i}-{m.split(':')[0]}" for i, (_, _, m) in enumerate(_error_cases())])
def test_errors_name_the_argument(spec, error, match, kernel_device):
    if kernel_device.type != "cpu":
        pytest.skip("the specs build CPU tensors (the device errors use the meta device)")
    args, kwargs = _build(spec)
    with pytest.raises(error, match=match):
        attention_kvcache(*args, **kwargs)


def test_check_false_skips_the_value_checks(kernel_device, monkeypatch):
    """check=False never reads the values on the host (no sync); valid inputs still give the
    right result."""
    case = KVCase("fp32-ieee", 1, (9, 30), (4, 2), 64, 16, 32, fwd=F(16, 16, 4, 1, num_splits=2))
    called = []
    monkeypatch.setattr(kvcache, "check_kvcache_values", lambda *a, **k: called.append(a))
    check_kvcache(case, kernel_device, check=False)
    assert called == []
    check_kvcache(case, kernel_device)
    assert len(called) == 1


# ----------------------------------------------------------------------------------
# Real decode sizes on the GPU
# ----------------------------------------------------------------------------------
def _gpu_cases() -> list[KVCase]:
    gen = torch.Generator().manual_seed(12)
    lens = tuple(int(x) for x in torch.randint(1, 4096, (8,), generator=gen)) + (0, 4096)
    return [
        KVCase("bf16", 1, lens, (32, 8), 128, 16, 4096, spare_pages=64),
        KVCase("bf16", 1, lens, (32, 8), 128, 256, 4096, spare_pages=4),
        KVCase("bf16", 4, lens, (32, 8), 128, 64, 4096, causal=True),
        KVCase("bf16", 16, lens[:4], (64, 8), 128, None, 4096, causal=True),
        KVCase("bf16", 1, lens[:4], (8, 1), 256, 128, 4096, fwd=F(64, 64, 4, 2, num_splits=16)),
        KVCase("fp16", 3, lens, (16, 2), 64, 16, 4096, causal=True, max_seqlen_k=4096),
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("case", _gpu_cases(), ids=str)
def test_kvcache_real_sizes_gpu(case):
    errors = check_kvcache(case, torch.device("cuda"))
    print(case, {name: f"{e:.2e}" for name, e in errors.items()})
