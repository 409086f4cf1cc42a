"""Launch plans: what a launcher does for one call signature, recorded on its first call
and replayed on the next ones without flashtune's or triton's per-call Python.

A launcher (forward.attention_forward, backward.attention_backward) spends most of a
small call's host time computing what does not change between calls of one signature
(shapes, strides, dtypes, configs, flags): the geometry, the schedule, the argument list of
40-60 values, and triton's binding and specialisation of that list, before the launch
itself (docs/design.md: 97 us of host time for a forward whose launch is 13 us
on the H200). ``planned()`` runs a launcher under a recorder the first time it sees a
signature: the launcher allocates through ``empty``/``empty_like``/``zeros`` here, launches
through ``launch`` here (Triton or Gluon kernels) and copies through ``copy_`` here, and the
recorder notes each allocation, each launch's compiled kernel and its bound arguments, each
copy, and which argument is which tensor (an input, an allocation, a view of one, a TMA
descriptor over one: triton's or Gluon's). The next call of the signature allocates the same
tensors and calls each compiled kernel's own launcher with the recorded arguments, the
tensors swapped in, and makes the same copies, in the recorded order.

A plan is made only when everything the launcher did is known to the recorder: a
launcher that does other tensor work (a copy, a zero fill) calls ``unplannable()``, and a
launch argument that is a tensor the recorder cannot place makes the call unplannable
too; unplannable signatures run the launcher every time. The signature (``tensor_key``
of each input and everything else the launcher reads) decides every value of the
argument lists but the data pointers; the pointers' 16-byte alignment, which triton
specialises on, is part of it.

Under the Triton interpreter (no compiled kernels) a replay calls the kernel's ``run``
with the recorded arguments instead, so the CPU tests exercise the same recording and
substitution. ``FLASHTUNE_LAUNCH_PLANS=0`` turns plans off.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import torch

from flashtune.device import INTERPRETER
from flashtune.interpreter_lock import serialise_launches

try:
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover - older triton
    _knobs = None
try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover
    TensorDescriptor = None
# Gluon's descriptor classes (triton.experimental.gluon.nvidia.*: dataclasses with a ``base``
# tensor and a shared-memory layout) are recognised by module, so that recording never
# imports Gluon
_GLUON_DESCRIPTOR_MODULE = "triton.experimental.gluon."

serialise_launches()  # the interpreter's launches share its module state: one at a time

ENABLED = os.environ.get("FLASHTUNE_LAUNCH_PLANS", "1") != "0"
MAX_PLANS = 4096  # per cache; a cache past it is cleared (a new signature costs one recorded call)

_local = threading.local()


class Unplannable(Exception):
    """The recorded call did something a plan cannot repeat."""


def tensor_key(t: torch.Tensor) -> tuple:
    """What of a tensor argument a launcher's work depends on, other than its data:
    shape, strides, dtype, device and the data pointer's alignment to 16 bytes (triton
    specialises on it; TMA needs it). Whether offsets need int64 (common.needs_int64)
    follows from shape and strides: its storage-size test only passes where the strides'
    extent, which it also needs, already does."""
    return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15)


# --- what launchers call -------------------------------------------------------------

def launch(kernel, *args, grid, warmup: bool = False, **kwargs):
    """``kernel.run(*args, grid=grid, warmup=warmup, **kwargs)``, noted by the recorder
    when one is active."""
    compiled = kernel.run(*args, grid=grid, warmup=warmup, **kwargs)
    recorder = getattr(_local, "recorder", None)
    if recorder is not None:
        recorder.launched(kernel, compiled, args, kwargs, grid, warmup)
    return compiled


def empty(shape, *, dtype: torch.dtype, device) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype, device=device)``, noted by the recorder."""
    return _allocated(torch.empty(shape, dtype=dtype, device=device))


def empty_like(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.empty_like(t, dtype=dtype)``, noted by the recorder."""
    return _allocated(torch.empty_like(t, dtype=dtype))


def zeros(shape, *, dtype: torch.dtype, device) -> torch.Tensor:
    """``torch.zeros(shape, dtype=dtype, device=device)``, noted by the recorder (a replay
    allocates and zero-fills it at the same point)."""
    return _allocated(torch.zeros(shape, dtype=dtype, device=device), zero=True)


def copy_(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``dst.copy_(src)``, noted by the recorder: both must be inputs or allocations of the call
    (or views of allocations), else the call gets no plan."""
    dst.copy_(src)
    recorder = getattr(_local, "recorder", None)
    if recorder is not None and recorder.ok:
        try:
            recorder.steps.append(("copy", recorder.ref(dst), recorder.ref(src)))
        except Unplannable:
            recorder.ok = False
    return dst


def unplannable() -> None:
    """Say that the call being run does tensor work outside ``launch`` and the
    allocators here (a copy, a fill): its signature then never gets a plan."""
    recorder = getattr(_local, "recorder", None)
    if recorder is not None:
        recorder.ok = False


def _allocated(t: torch.Tensor, zero: bool = False) -> torch.Tensor:
    recorder = getattr(_local, "recorder", None)
    if recorder is not None:
        recorder.slot_of[id(t)] = len(recorder.slots)
        recorder.slots.append(t)
        recorder.allocs.append((tuple(t.shape), t.stride(), t.dtype, t.device))
        if zero:  # the fill is a step: it runs where the call made it, between launches
            recorder.steps.append(("zero", ("slot", len(recorder.slots) - 1)))
    return t


# --- recording -----------------------------------------------------------------------

@dataclass(frozen=True)
class _Launch:
    kernel: object        # the JITFunction (the interpreter's replay calls its run)
    runner: object        # the compiled kernel's launcher (None under the interpreter)
    function: object
    packed_metadata: object
    grid: tuple
    template: tuple       # the launcher's arguments, tensors as placeholders
    refs: tuple           # (position, ref) of each tensor argument
    kwargs: dict          # the interpreter's keyword arguments (constexprs, options)
    kw_refs: tuple        # (name, ref) of tensor keyword arguments (interpreter)


class _Recorder:
    def __init__(self, inputs):
        self.slots = list(inputs)
        self.n_inputs = len(inputs)
        self.slot_of = {id(t): i for i, t in enumerate(inputs)}
        self.allocs: list[tuple] = []
        # in call order: _Launch, ("zero", ref) or ("copy", dst ref, src ref)
        self.steps: list = []
        self.ok = True

    @property
    def launches(self) -> list:
        return [st for st in self.steps if isinstance(st, _Launch)]

    def ref(self, x):
        """How a replay rebuilds argument ``x``: ("slot", i), ("view", i, shape, stride,
        storage offset), ("desc", base ref, descriptor fields, descriptor class), or None for a constant;
        raises Unplannable for a tensor it cannot place."""
        if isinstance(x, torch.Tensor):
            i = self.slot_of.get(id(x))
            if i is not None:
                return ("slot", i)
            # a view of an allocation (never of an input: two inputs may share a storage
            # in one call and not in the next)
            ptr = x.untyped_storage().data_ptr()
            for i in range(self.n_inputs, len(self.slots)):
                s = self.slots[i]
                if s.untyped_storage().data_ptr() == ptr and s.dtype == x.dtype and s.device == x.device:
                    return ("view", i, tuple(x.shape), x.stride(), x.storage_offset())
            raise Unplannable("a tensor argument that is neither an input nor allocated by the call")
        if (TensorDescriptor is not None and isinstance(x, TensorDescriptor)) \
                or type(x).__module__.startswith(_GLUON_DESCRIPTOR_MODULE) and hasattr(x, "base"):
            fields = {name: value for name, value in vars(x).items() if name != "base"}
            return ("desc", self.ref(x.base), fields, type(x))
        return None

    def launched(self, kernel, compiled, args, kwargs, grid, warmup) -> None:
        if not self.ok:
            return
        if warmup or callable(grid):
            self.ok = False
            return
        try:
            grid = tuple(grid) + (1,) * (3 - len(grid))
            if INTERPRETER:
                values, runner, function, packed = tuple(args), None, None, None
                kw = dict(kwargs)
                kw_refs = tuple((n, r) for n, r in ((n, self.ref(v)) for n, v in kw.items()) if r is not None)
            elif compiled is None:
                raise Unplannable("no compiled kernel")
            else:
                device = torch.cuda.current_device()
                binder = kernel.device_caches[device][4]
                bound, _, _ = binder(*args, **kwargs)
                values = tuple(bound.values())
                runner, function, packed = compiled.run, compiled.function, compiled.packed_metadata
                kw, kw_refs = {}, ()
            refs = tuple((p, r) for p, r in ((p, self.ref(v)) for p, v in enumerate(values)) if r is not None)
            placed = {p for p, _ in refs}
            template = tuple(None if p in placed else v for p, v in enumerate(values))
        except Unplannable:
            self.ok = False
            return
        self.steps.append(_Launch(kernel, runner, function, packed, grid, template, refs, kw, kw_refs))


def _descriptor(cls, fields: dict, base: torch.Tensor):
    """A TMA descriptor of class ``cls`` over ``base`` with a recorded one's fields (checked
    when it was made: the signature keeps base's alignment and strides as they were)."""
    desc = cls.__new__(cls)
    desc.__dict__.update(fields)
    desc.base = base
    return desc


class Plan:
    """A recorded call: its allocations, its launches and where its outputs are, compiled
    into one Python function (as triton generates its own launchers) that allocates, calls
    each compiled kernel's launcher with the recorded arguments and returns the outputs."""

    def __init__(self, recorder: _Recorder, outputs: tuple, device: torch.device):
        self.n_inputs = recorder.n_inputs
        self.allocs = tuple(recorder.allocs)
        self.steps = tuple(recorder.steps)
        self.launches = tuple(recorder.launches)
        self.outputs = outputs
        self.device_index = device.index if device.type == "cuda" else None
        self.replays = 0  # calls served (tests: that a plan is used, not only made)
        self.source, self._run = self._compile()

    def _compile(self):
        namespace = {"_empty_strided": torch.empty_strided, "_descriptor": _descriptor,
                     "_current_stream": _current_stream}

        def const(value) -> str:
            if type(value) in (int, bool) or value is None:
                return repr(value)
            name = f"_c{len(namespace)}"
            namespace[name] = value
            return name

        def expr(ref) -> str:
            if ref[0] == "slot":
                return f"s{ref[1]}"
            if ref[0] == "view":
                return f"s{ref[1]}.as_strided({const(ref[2])}, {const(ref[3])}, {ref[4]})"
            return f"_descriptor({const(ref[3])}, {const(ref[2])}, {expr(ref[1])})"

        body = []
        if self.device_index is not None:
            body.append(f"stream = _current_stream({self.device_index})")
        for j, (shape, stride, dtype, device) in enumerate(self.allocs):
            body.append(f"s{self.n_inputs + j} = _empty_strided({const(shape)}, {const(stride)}, dtype={const(dtype)}, "
                        f"device={const(device)})")
        for ln in self.steps:
            if not isinstance(ln, _Launch):
                if ln[0] == "zero":
                    body.append(f"{expr(ln[1])}.zero_()")
                else:
                    body.append(f"{expr(ln[1])}.copy_({expr(ln[2])})")
                continue
            refs = dict(ln.refs)
            args = [expr(refs[p]) if p in refs else const(v) for p, v in enumerate(ln.template)]
            if ln.runner is None:  # the interpreter: the kernel's run, as the launcher called it
                kw_refs = dict(ln.kw_refs)
                args += [f"grid={const(ln.grid)}", "warmup=False"]
                args += [f"{n}={expr(kw_refs[n]) if n in kw_refs else const(v)}" for n, v in ln.kwargs.items()]
                body.append(f"{const(ln.kernel)}.run({', '.join(args)})")
            else:
                g0, g1, g2 = ln.grid
                body.append(f"{const(ln.runner)}({g0}, {g1}, {g2}, stream, {const(ln.function)}, "
                            f"{const(ln.packed_metadata)}, None, None, None, {', '.join(args)})")
        body.append(f"return ({', '.join(expr(r) for r in self.outputs)},)")
        source = f"def replay({', '.join(f's{i}' for i in range(self.n_inputs))}):\n" + \
            "\n".join("    " + line for line in body) + "\n"
        exec(compile(source, "<flashtune launch plan>", "exec"), namespace)
        return source, namespace["replay"]

    def replay(self, inputs):
        """The outputs of the call on ``inputs``, or None where a plan cannot run now (a
        launch hook is set, another device is current): the caller runs the launcher."""
        index = self.device_index
        if index is not None and (torch.cuda.current_device() != index or (_knobs is not None and getattr(
                _knobs.runtime.launch_enter_hook, "calls", _knobs.runtime.launch_enter_hook))):
            # a launch hook (triton's HookChain, a profiler's) gets its calls through the launcher
            return None
        out = self._run(*inputs)
        self.replays += 1
        return out


try:
    from torch._C import _cuda_getCurrentRawStream as _current_stream
except ImportError:  # pragma: no cover - a torch without CUDA
    def _current_stream(index):
        return torch.cuda.current_stream(index).cuda_stream


def planned(cache: dict, key, inputs: tuple, run):
    """``run()``'s outputs (a tuple of tensors) for the call with ``inputs`` and signature
    ``key``: through its plan in ``cache`` when there is one, else by running ``run`` (under
    a recorder the first time, keeping a plan if the call was plannable). ``key`` None (an
    unhashable signature) or plans off: ``run()`` as it is."""
    if key is None or not ENABLED or getattr(_local, "recorder", None) is not None:
        return run()
    try:
        plan = cache.get(key)
    except TypeError:  # an unhashable part of the signature
        return run()
    if plan is False:  # seen, unplannable
        return run()
    if plan is not None:
        out = plan.replay(inputs)
        if out is not None:
            return out
        return run()
    if len({id(t) for t in inputs}) != len(inputs):  # one tensor as two inputs: not recorded as a plan
        return run()
    recorder = _Recorder(inputs)
    _local.recorder = recorder
    try:
        out = run()
    finally:
        _local.recorder = None
    if len(cache) >= MAX_PLANS:
        cache.clear()
    try:
        if not recorder.ok or not recorder.launches:
            raise Unplannable("the call did work a plan cannot repeat")
        outputs = tuple(recorder.ref(t) for t in out)
        if any(r is None or r[0] == "desc" for r in outputs):
            raise Unplannable("an output that is not a tensor")
        cache[key] = Plan(recorder, outputs, inputs[0].device)
    except Unplannable:
        cache[key] = False
    return out
