"""The config classes the search space can produce, one representative each, and the doubles
that let the correctness gate be tried on all of them without a GPU.

A class is a way a config's launch differs: a kernel family, atomic dQ, split-KV, GQA
packing, TMA, the persistent grid, the fused dQ, ... Each representative is a config of the
search space (``kernels.space.candidates``) that validates for its class's key; together they
hold every value of every field of the space (test_gate.py checks both, so a field or value
added to the space needs a class here).

Under the Triton interpreter the Triton families run their real kernels; the Gluon families
cannot run there, so their launch is replaced by ``reference_launch`` (a plain float64
attention, the right answer) and the fault of ``flashtune.autotuner.faults`` makes it wrong,
as it does a real launch. On a GPU the Gluon configs run for real (test_gate_gpu.py).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from flashtune.autotuner.scheduler import DeviceWorker
from flashtune.autotuner.worker import serve
from flashtune.configs.backward import BwdConfig
from flashtune.configs.forward import FwdConfig
from flashtune.keys import GpuInfo, TuningKey


@dataclasses.dataclass(frozen=True)
class ConfigClass:
    name: str
    key_name: str  # which of KEYS it runs on
    config: object

    @property
    def pass_(self) -> str:
        return self.config.PASS

    @property
    def gluon(self) -> bool:
        return bool(self.config.family)

    def __str__(self) -> str:
        return self.name


def keys(gpu: str = GpuInfo.interpreter().key, *, gluon_head_dim: int = 64, gluon_seq: int = 16,
         gluon_dtype: str = "float16") -> dict[str, TuningKey]:
    """The keys the classes run on. The Triton forward's is a grouped decode-like call (16
    queries per head against 64 keys, 2 query heads per K/V head), so that split-KV and GQA
    packing take their split kernel; the Triton backward's is grouped too (dK/dV split over
    heads); 16-bit, so TMA validates. The Gluon families run head dims 64 and 128, 16-bit."""
    return {
        "fwd": TuningKey(gpu, "float16", 16, 16, False, "fwd", seq_k=64, group=2, batch_heads=4),
        "bwd": TuningKey(gpu, "float16", 16, 32, True, "bwd", group=2, batch_heads=4),
        "fwd-gluon": TuningKey(gpu, gluon_dtype, gluon_head_dim, gluon_seq, True, "fwd"),
        "bwd-gluon": TuningKey(gpu, gluon_dtype, gluon_head_dim, gluon_seq, True, "bwd"),
    }


def _fwd(name, block_m, block_n, warps, stages, **fields) -> ConfigClass:
    key_name = "fwd-gluon" if fields.get("family") else "fwd"
    return ConfigClass(name, key_name, FwdConfig(block_m, block_n, warps, stages, **fields))


def _bwd(name, m1, n1, m2, n2, warps, stages, **fields) -> ConfigClass:
    key_name = "bwd-gluon" if fields.get("family") else "bwd"
    return ConfigClass(name, key_name, BwdConfig(m1, n1, m2, n2, warps, stages, **fields))


CLASSES: tuple[ConfigClass, ...] = (
    # the Triton forward: the plain kernel, TMA loads, the split kernel's schedules
    _fwd("fwd auto schedule", 64, 64, 4, 2),
    _fwd("fwd plain kernel", 32, 32, 8, 1, num_splits=1, pack_gqa=0),
    _fwd("fwd tma", 128, 16, 4, 3, tma=1, num_splits=1, pack_gqa=0),
    _fwd("fwd split-kv", 16, 16, 4, 4, num_splits=4, pack_gqa=0),
    _fwd("fwd split-kv mostly empty chunks", 256, 16, 4, 1, num_splits=16, pack_gqa=0),
    _fwd("fwd gqa packed", 32, 128, 4, 2, num_splits=1, pack_gqa=1),
    _fwd("fwd gqa packed split-kv tma", 64, 32, 8, 2, tma=1, num_splits=4, pack_gqa=1),
    # the Gluon forward (family 1)
    _fwd("fwd gluon", 64, 128, 4, 2, family=1),
    _fwd("fwd gluon without ping-pong", 64, 64, 4, 3, family=1, pingpong=0),
    _fwd("fwd gluon sequential softmax", 128, 64, 4, 2, family=1, overlap=0),
    _fwd("fwd gluon persistent", 64, 128, 4, 2, family=1, persistent=1),
    _fwd("fwd gluon persistent o-tile", 64, 64, 4, 2, family=1, persistent=1, o_tile=1),
    _fwd("fwd gluon two CTAs per SM", 64, 64, 4, 2, family=1, overlap=0, occupancy=2),
    # the Triton backward: dQ kernel or atomic dQ, TMA, the dK/dV split
    _bwd("bwd dq kernel", 16, 32, 32, 16, 4, 1),
    _bwd("bwd dq kernel own launch", 32, 64, 64, 32, 8, 2, dq_num_warps=4, dq_num_stages=3),
    _bwd("bwd atomic dq", 64, 128, 128, 64, 4, 3, atomic_dq=1, dkdv_split=1),
    _bwd("bwd tma", 16, 64, 128, 16, 4, 2, dq_num_warps=8, dq_num_stages=1, tma=1),
    _bwd("bwd atomic dq tma", 32, 32, 32, 32, 8, 1, atomic_dq=1, tma=1),
    _bwd("bwd dkdv split over heads", 16, 32, 64, 64, 4, 2, dkdv_split=2),
    _bwd("bwd dkdv split over queries", 16, 32, 32, 16, 4, 1, dkdv_split=8),
    _bwd("bwd atomic dq dkdv split", 16, 32, 32, 16, 4, 1, atomic_dq=1, dkdv_split=4),
    # the Gluon backward: dK/dV kernel with the Triton dQ kernel (1), both Gluon (2), dQ fused (3, 4)
    _bwd("bwd gluon dkdv, triton dq", 64, 64, 64, 64, 4, 2, family=1),
    _bwd("bwd gluon dkdv, triton dq tma", 64, 64, 64, 32, 4, 2, family=1, tma=1, dq_num_warps=8),
    _bwd("bwd gluon dkdv split", 32, 64, 64, 64, 4, 2, family=1, dkdv_split=2),
    _bwd("bwd gluon dkdv and dq", 64, 64, 64, 64, 4, 2, family=2),
    _bwd("bwd gluon fused dq", 64, 64, 64, 64, 4, 2, family=3),
    _bwd("bwd gluon fused dq first", 64, 64, 64, 64, 4, 2, family=3, dq_first=1),
    _bwd("bwd gluon fused dq a step late", 64, 64, 64, 64, 4, 2, family=4),
    _bwd("bwd gluon fused dq a step late first", 64, 64, 64, 64, 4, 2, family=4, dq_first=1),
)


# -- the launch double: the right answer, computed plainly in float64 ------------------


def _plain_attention(q, k, v, *, causal: bool, sm_scale: float):
    """(o, natural log-sum-exp) of SDPA's layout in the inputs' precision, K/V heads shared
    by groups of query heads; causal aligned top-left (the trial's masking)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) * sm_scale
    if causal:
        n_q, n_k = scores.shape[-2:]
        above = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(above, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    return torch.softmax(scores, dim=-1) @ v, lse


def reference_launch(calls: list):
    """Stand-ins for ``attention_forward`` and ``attention_backward`` as the trial calls them:
    the right outputs for any config (each call's config appended to ``calls``)."""

    def forward(q, k, v, config, *, causal, sm_scale, compile_only=False):
        calls.append(config)
        o, lse = _plain_attention(q.double(), k.double(), v.double(), causal=causal, sm_scale=sm_scale)
        return o.to(q.dtype), (lse / math.log(2)).float()

    def backward(do, q, k, v, o, lse2, config, *, causal, sm_scale, compile_only=False):
        calls.append(config)
        leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
        out, _ = _plain_attention(*leaves, causal=causal, sm_scale=sm_scale)
        out.backward(do.double())
        return tuple(t.grad.to(x.dtype) for t, x in zip(leaves, (q, k, v)))

    return forward, backward


def use_reference_launch(monkeypatch) -> list:
    """Every trial in this process launches ``reference_launch``'s doubles (and times no dQ
    kernel alone); returns the list of the configs they were called with."""
    from flashtune.autotuner import trial

    calls: list = []
    forward, backward = reference_launch(calls)
    monkeypatch.setattr(trial, "attention_forward", forward)
    monkeypatch.setattr(trial, "attention_backward", backward)
    monkeypatch.setattr(trial, "dq_kernel_alone", lambda *args, **kwargs: None)
    return calls


class InlineWorker(DeviceWorker):
    """The search's device worker with its requests served in this process (``worker.serve``),
    so a launch double set in this process reaches the trials. No child, nothing to kill."""

    def __init__(self, device: str, *, interpreter: bool, stop):
        super().__init__(device, interpreter=interpreter, stop=stop)
        self._bench = None

    def _request(self, op, args, timeout):
        self._check()
        self._bench, reply = serve(self._bench, torch.device(self.device), op, args)
        return reply

    def _ensure(self, key) -> None:
        if self._key != key:
            self.setup(key)

    def close(self) -> None:
        self._bench = self._key = None


def search_rejecting_wrong_classes(key, configs: list, db, device: str, monkeypatch, **options) -> None:
    """Search ``key`` over exactly ``configs``, every one but the last made wrong
    (FAULT_WRONG), and check the gate held: each wrong one recorded ``incorrect``, none
    re-timed, the right one the stored result."""
    from autotuner_helpers import cid, stored_result, trials_of

    from flashtune.autotuner import key_search, search
    from flashtune.autotuner.faults import FAULT_WRONG
    from flashtune.autotuner.worker import TrialWorker

    monkeypatch.setattr(key_search, "valid_candidates", lambda *args: list(configs))
    retimed, real_retime = [], TrialWorker.retime

    def retime(worker, key, finalists, *args, **kwargs):
        retimed.extend(finalists)
        return real_retime(worker, key, finalists, *args, **kwargs)

    monkeypatch.setattr(TrialWorker, "retime", retime)
    wrong, right = configs[:-1], configs[-1]
    (result,) = search([key], db=db, trials=len(configs), device=device, finalists=len(configs), rounds=1,
                       faults={cfg: FAULT_WRONG for cfg in wrong}, **options).results
    assert result.status == "tuned" and result.outcomes == {"incorrect": len(wrong), "ok": 1}, result
    statuses = {cid(t.config): t.status for t in trials_of(db, key)}
    assert statuses == {**{cid(c): "incorrect" for c in wrong}, cid(right): "ok"}
    assert [cid(c) for c in retimed] == [cid(right)]
    assert cid(result.winner) == cid(right) == cid(stored_result(db, key).config)
