"""Probes: small runtime sanitizers built on torch's own instrumentation.

A probe is installed from outside a fixture (the fixture never measures
itself), observes one run of the fixture's ``main(device, steps)``, returns a
*sample* (a JSON-able dict) per run, and finally decides from the samples at
``N`` and ``2N`` steps with :meth:`Probe.decide`, which returns a
:class:`Measurement`: a number, its unit, the stated threshold and whether the
run is defective.

Probes and the rule directories they judge:

=================  ===========  ==========================================================
probe              rules        defect when
=================  ===========  ==========================================================
stale-gradients    TGL001       >= 1 optimizer step whose gradients a backward added on top
                                of gradients an earlier optimizer step already consumed
grad-mode          TGL002       >= 1 grad-mode failure: a RuntimeError of autograd saying a
                                tensor does not require grad / has no grad_fn, or a
                                ``create_graph=True`` result that carries no graph
retained-graph     TGL101,      live autograd nodes grow >= 0.5 node/step, or live saved
                   TGL102       tensors grow >= 1 KiB/step (N -> 2N steps), or (TGL102)
                                >= 0.5 retained-and-never-reused graphs per step
module-mode        TGL201       >= 1 call of a dropout (p > 0) or batch-norm module in
                                training mode while grad mode is off (no_grad/inference_mode)
=================  ===========  ==========================================================
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import re
import time
import weakref
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, ClassVar, Iterator, Optional

import torch

KIB = 1024.0


@dataclass
class Measurement:
    """A probe's decision for one fixture on one device.

    ``figure`` is the headline number in ``unit``; ``display`` is the human
    form ("+6.4 KiB/step", "stale-gradient steps: 7/8"); ``threshold`` states
    the rule that separates defect from healthy; ``details`` holds the other
    measured numbers (all JSON-able).
    """

    probe: str
    figure: float
    unit: str
    display: str
    threshold: str
    defect: bool
    details: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """This measurement as a JSON-able dict."""
        return asdict(self)


def human_bytes(n: float, signed: bool = False) -> str:
    """``6553.6`` -> ``"6.4 KiB"`` (binary units); ``signed`` adds ``+`` to non-negative values."""
    sign = "-" if n < 0 else ("+" if signed else "")
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            text = f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
            return sign + text
        n /= 1024
    return sign + f"{n:.1f} GiB"  # pragma: no cover


# --------------------------------------------------------------------------------------------------
# Shared instrumentation: wrappers around torch.autograd.backward / grad, installed once per process.
# --------------------------------------------------------------------------------------------------

_autograd_listeners: list[Any] = []
_autograd_installed = False


def install_autograd_wrappers() -> None:
    """Wrap ``torch.autograd.backward`` and ``torch.autograd.grad`` once per process.

    ``Tensor.backward`` calls ``torch.autograd.backward`` through the module
    attribute, so it is covered too. Listeners (probes) get
    ``on_backward_begin(kind, retain, create_graph)``,
    ``on_backward_end(kind, result, create_graph)`` and
    ``on_backward_error(kind, exc)``. Call before importing a fixture so that
    ``from torch.autograd import grad`` binds the wrapper.
    """
    global _autograd_installed
    if _autograd_installed:
        return
    _autograd_installed = True
    orig_backward = torch.autograd.backward
    orig_grad = torch.autograd.grad

    def _wrap(kind: str, orig: Callable, retain_pos: int, create_pos: int) -> Callable:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            create = kwargs.get("create_graph", args[create_pos] if len(args) > create_pos else False)
            retain = kwargs.get("retain_graph", args[retain_pos] if len(args) > retain_pos else None)
            retain = bool(create) if retain is None else bool(retain)
            listeners = list(_autograd_listeners)
            for lst in listeners:
                lst.on_backward_begin(kind, retain, bool(create))
            try:
                result = orig(*args, **kwargs)
            except Exception as exc:
                for lst in listeners:
                    lst.on_backward_error(kind, exc)
                raise
            for lst in listeners:
                lst.on_backward_end(kind, result, bool(create))
            return result

        wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
        wrapper.__doc__ = orig.__doc__
        return wrapper

    # backward(tensors, grad_tensors, retain_graph, create_graph, ...)
    torch.autograd.backward = _wrap("backward", orig_backward, 2, 3)
    # grad(outputs, inputs, grad_outputs, retain_graph, create_graph, ...)
    torch.autograd.grad = _wrap("grad", orig_grad, 3, 4)


class _AutogradListener:
    """Default no-op callbacks for :func:`install_autograd_wrappers`."""

    def on_backward_begin(self, kind: str, retain: bool, create_graph: bool) -> None:
        pass

    def on_backward_end(self, kind: str, result: Any, create_graph: bool) -> None:
        pass

    def on_backward_error(self, kind: str, exc: BaseException) -> None:
        pass


# --------------------------------------------------------------------------------------------------
# Probe base
# --------------------------------------------------------------------------------------------------


class Probe(_AutogradListener):
    """Base class. One instance observes one run (``steps`` fixed).

    Lifecycle, driven by the worker: ``with probe.observe(device, steps): main(device, steps)``;
    ``probe.on_main_return(frame)`` at the return of ``main`` (frame locals still alive) when
    :attr:`needs_frame` is set; ``probe.on_exception(exc)`` when ``main`` raised;
    ``probe.sample()`` after the run; :meth:`decide` over the samples of the runs at N and 2N.
    """

    name: ClassVar[str] = ""
    rules: ClassVar[tuple[str, ...]] = ()
    unit: ClassVar[str] = ""
    threshold: ClassVar[str] = ""
    needs_frame: ClassVar[bool] = False
    #: exceptions this probe treats as its measured defect rather than a crash
    handles_exceptions: ClassVar[bool] = False

    def __init__(self) -> None:
        self.device = "cpu"
        self.steps = 0
        self.exception: Optional[dict] = None

    @contextmanager
    def observe(self, device: str, steps: int) -> Iterator["Probe"]:
        """Install the probe's hooks for one run, remove them afterwards."""
        self.device, self.steps = device, steps
        _autograd_listeners.append(self)
        try:
            with ExitStack() as stack:
                self._install(stack)
                yield self
        finally:
            _autograd_listeners.remove(self)

    def _install(self, stack: ExitStack) -> None:
        """Register hooks; push their removal onto ``stack``."""

    def on_main_return(self, frame: Any) -> None:
        """Called at the return event of ``main`` while its locals are alive."""

    def on_exception(self, exc: BaseException) -> bool:
        """``main`` raised ``exc``; return ``True`` if it is this probe's measured defect."""
        return False

    def sample(self) -> dict:
        """The JSON-able figures of this run."""
        raise NotImplementedError

    @classmethod
    def decide(cls, samples: dict[int, dict]) -> Measurement:
        """Measurement from the samples keyed by step count (N and 2N)."""
        raise NotImplementedError


# --------------------------------------------------------------------------------------------------
# TGL001: stale gradients
# --------------------------------------------------------------------------------------------------


class StaleGradientProbe(Probe):
    """Counts optimizer steps that consume gradients summed onto already-consumed ones.

    Global optimizer step hooks
    (:func:`torch.optim.optimizer.register_optimizer_step_pre_hook` / ``post_hook``)
    snapshot every parameter's gradient right after each ``step()``. Gradient hooks
    (:meth:`torch.Tensor.register_hook`, which run before ``AccumulateGrad``) on every
    parameter an optimizer owns check, when a backward is about to accumulate, whether
    ``p.grad`` still equals (nonzero, same values) the gradient the last step consumed:
    then this backward adds into a consumed gradient. The next ``step()`` is counted
    as a *stale-gradient step*.

    Figure: stale-gradient steps (count) out of all optimizer steps of the run at N.
    Threshold: defect when >= 1 stale-gradient step in either run (healthy loops have 0;
    the first step can never be stale).
    """

    name = "stale-gradients"
    rules = ("TGL001",)
    unit = "steps"
    threshold = ">= 1 optimizer step consumed gradients added onto a gradient an earlier step already used"

    def __init__(self) -> None:
        super().__init__()
        self.steps_total = 0
        self.stale_steps = 0
        self.stale_accumulations = 0
        self._pending = False
        self._snap: dict[int, torch.Tensor] = {}
        self._hooked: dict[int, Any] = {}

    def _install(self, stack: ExitStack) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        pre = register_optimizer_step_pre_hook(self._pre_step)
        post = register_optimizer_step_post_hook(self._post_step)
        stack.callback(pre.remove)
        stack.callback(post.remove)
        stack.callback(self._remove_param_hooks)

    def _remove_param_hooks(self) -> None:
        for handle in self._hooked.values():
            handle.remove()
        self._hooked.clear()
        self._snap.clear()

    def _params(self, optimizer: Any) -> Iterator[torch.Tensor]:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if isinstance(p, torch.Tensor):
                    yield p

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.steps_total += 1
        if self._pending:
            self.stale_steps += 1
        self._pending = False
        for p in self._params(optimizer):
            if id(p) not in self._hooked and p.requires_grad:
                self._hooked[id(p)] = p.register_hook(self._make_grad_hook(p))

    def _post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        for p in self._params(optimizer):
            g = p.grad
            if g is not None and not g.is_sparse:
                self._snap[id(p)] = g.detach().clone()
            else:
                self._snap.pop(id(p), None)

    def _make_grad_hook(self, p: torch.Tensor) -> Callable:
        ref = weakref.ref(p)

        def hook(grad: torch.Tensor) -> None:
            param = ref()
            if param is None:
                return None
            current = param.grad
            snap = self._snap.get(id(param))
            if current is None or snap is None or current.is_sparse or current.shape != snap.shape:
                return None
            with torch.no_grad():
                if bool(current.any()) and torch.equal(current, snap):
                    self._pending = True
                    self.stale_accumulations += 1
            return None

        return hook

    def sample(self) -> dict:
        """``steps_total``, ``stale_steps``, ``stale_accumulations`` (parameter-level)."""
        return {"steps_total": self.steps_total, "stale_steps": self.stale_steps,
                "stale_accumulations": self.stale_accumulations}

    @classmethod
    def decide(cls, samples: dict[int, dict]) -> Measurement:
        """Defect iff a run has >= 1 stale-gradient step; the figure is the run at N."""
        n = min(samples)
        s = samples[n]
        defect = any(v["stale_steps"] >= 1 for v in samples.values())
        return Measurement(cls.name, float(s["stale_steps"]), cls.unit,
                           f"stale-gradient steps: {s['stale_steps']}/{s['steps_total']}",
                           cls.threshold, defect, {"runs": {str(k): v for k, v in samples.items()}})


# --------------------------------------------------------------------------------------------------
# TGL002: grad-mode failures
# --------------------------------------------------------------------------------------------------

GRAD_MODE_ERRORS = re.compile(
    r"does not require grad|does not have a grad_fn|differentiated Tensors? (?:appears|does) not|"
    r"Inference tensors cannot be saved for backward|element \d+ of tensors does not require grad",
    re.IGNORECASE,
)


class GradModeProbe(Probe):
    """Records grad-mode failures of backward / ``torch.autograd.grad``.

    Two kinds: (1) an exception raised by autograd whose message says a tensor does
    not require grad or has no ``grad_fn`` (e.g. ``RuntimeError: element 0 of tensors
    does not require grad and does not have a grad_fn``), whether or not the fixture
    catches it; (2) a ``torch.autograd.grad(..., create_graph=True)`` result that
    contributes no gradient: it carries no graph (``requires_grad`` is ``False``), or no
    later backward ever propagates through it (a tensor hook on the result never fires,
    e.g. a gradient penalty computed from it under no_grad).

    Figure: grad-mode failures (count) in the run at N. Threshold: defect when >= 1.
    """

    name = "grad-mode"
    rules = ("TGL002",)
    unit = "failures"
    threshold = ">= 1 autograd 'does not require grad' error, or a create_graph result that contributes no gradient"
    handles_exceptions = True

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[str] = []
        self.graphless = 0
        self.calls = 0
        self._seen: set[int] = set()
        self._graph_used: list[bool] = []

    def on_backward_begin(self, kind: str, retain: bool, create_graph: bool) -> None:
        self.calls += 1

    def on_backward_end(self, kind: str, result: Any, create_graph: bool) -> None:
        if kind == "grad" and create_graph and result is not None:
            for t in result:
                if not isinstance(t, torch.Tensor):
                    continue
                if not t.requires_grad:
                    self.graphless += 1
                    continue
                index = len(self._graph_used)
                self._graph_used.append(False)
                t.register_hook(self._make_used_hook(index))

    def _make_used_hook(self, index: int) -> Callable:
        def hook(grad: torch.Tensor) -> None:
            self._graph_used[index] = True
            return None

        return hook

    def on_backward_error(self, kind: str, exc: BaseException) -> None:
        if isinstance(exc, RuntimeError) and GRAD_MODE_ERRORS.search(str(exc)):
            self._seen.add(id(exc))
            self.errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")

    def on_exception(self, exc: BaseException) -> bool:
        if id(exc) in self._seen:
            return True
        if isinstance(exc, RuntimeError) and GRAD_MODE_ERRORS.search(str(exc)):
            self.errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
            return True
        return False

    def sample(self) -> dict:
        """``errors`` (type: message), ``graphless_create_graph`` results (no graph, or a graph no
        later backward ever used), ``create_graph_results``, autograd ``calls``."""
        unused = sum(1 for used in self._graph_used if not used)
        return {"errors": list(self.errors), "graphless_create_graph": self.graphless + unused,
                "create_graph_results": len(self._graph_used) + self.graphless, "calls": self.calls}

    @classmethod
    def decide(cls, samples: dict[int, dict]) -> Measurement:
        """Defect iff a run has >= 1 grad-mode error or graphless create_graph result."""
        n = min(samples)
        s = samples[n]
        count = len(s["errors"]) + s["graphless_create_graph"]
        defect = any(len(v["errors"]) + v["graphless_create_graph"] >= 1 for v in samples.values())
        if s["errors"]:
            display = s["errors"][0]
            if count > 1:
                display += f" (+{count - 1} more)"
        elif s["graphless_create_graph"]:
            display = (f"create_graph results contributing no gradient: {s['graphless_create_graph']}"
                       f"/{s['create_graph_results']}")
        else:
            display = f"grad-mode failures: 0 ({s['calls']} backward/grad calls)"
        return Measurement(cls.name, float(count), cls.unit, display, cls.threshold, defect,
                           {"runs": {str(k): v for k, v in samples.items()}})


# --------------------------------------------------------------------------------------------------
# TGL101 / TGL102: retained graph
# --------------------------------------------------------------------------------------------------


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                 "fordblks", "keepcost")]


def _load_mallinfo() -> Optional[Callable[[], int]]:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2

    def heap() -> int:
        m = fn()
        return int(m.uordblks + m.hblkhd)

    return heap


_heap_in_use = _load_mallinfo()


def host_heap_bytes() -> Optional[int]:
    """Bytes in use by the C heap (glibc ``mallinfo2``: ``uordblks + hblkhd``); ``None`` elsewhere.

    CPU tensors and autograd's graph bookkeeping live there.
    """
    return _heap_in_use() if _heap_in_use is not None else None


def count_live_graph_nodes() -> int:
    """Autograd nodes reachable from live tensors (``gc`` over tensors with a ``grad_fn``).

    Walks ``grad_fn.next_functions`` from every live tensor's ``grad_fn``; each node
    counted once. Cost: one pass over ``gc.get_objects()`` (~0.1 s).
    """
    seen: dict[int, Any] = {}
    stack: list[Any] = []
    tensor_type = torch.Tensor
    for obj in gc.get_objects():
        if issubclass(type(obj), tensor_type):
            try:
                fn = obj.grad_fn
            except Exception:  # pragma: no cover - exotic tensor subclasses
                continue
            if fn is not None:
                stack.append(fn)
    while stack:
        fn = stack.pop()
        if id(fn) in seen:
            continue
        seen[id(fn)] = fn  # keep alive so ids stay unique
        for nxt, _ in getattr(fn, "next_functions", ()):
            if nxt is not None and id(nxt) not in seen:
                stack.append(nxt)
    n = len(seen)
    seen.clear()
    return n


class _Packed:
    __slots__ = ("t", "key", "last_call", "__weakref__")

    def __init__(self, t: torch.Tensor, key: tuple) -> None:
        self.t = t
        self.key = key
        self.last_call: Optional[int] = None


@dataclass
class _BackwardCall:
    retain: bool
    unpacked: int = 0
    reused: bool = False


class RetainedGraphProbe(Probe):
    """Saved tensors and autograd nodes kept alive, and how they grow with steps.

    Instrumentation (all from outside the fixture):

    * :class:`torch.autograd.graph.saved_tensors_hooks` around the whole ``main``: every
      tensor autograd saves is wrapped; a :func:`weakref.finalize` on the wrapper accounts
      when the graph releases it. Live *saved bytes* are counted per storage (a storage
      saved twice counts once); parameters (leaves that require grad) are not counted.
    * at the return of ``main`` (its locals still alive): ``gc.collect()``, live graph
      nodes (:func:`count_live_graph_nodes`), live saved bytes, the C heap in use
      (:func:`host_heap_bytes`) and, on CUDA, ``torch.cuda.memory_allocated``;
    * backward calls with ``retain_graph=True`` whose saved tensors no later backward
      ever unpacks again (a graph retained for nothing);
    * wall time of the run (time per step; grows with steps when state is carried).

    Figure: retained bytes per step from N to 2N steps: growth of the C heap in use
    (plus CUDA memory allocated on CUDA) at the return of ``main``, or of saved tensors at
    their peak when that is larger, e.g. "+6.4 KiB/step". The heap figure carries a few KiB/step
    of allocator noise, so it is reported but does not decide.
    Threshold (deterministic counters): defect when live autograd nodes grow >= 0.5
    node/step, or live saved tensors (at the end or at their peak) grow >= 1 KiB/step,
    or >= 0.5 retained-and-never-reused graphs per step.
    """

    name = "retained-graph"
    rules = ("TGL101", "TGL102")
    unit = "B/step"
    threshold = ("live autograd nodes grow >= 0.5 node/step, or live saved tensors grow >= 1 KiB/step, "
                 "or >= 0.5 retained-but-never-reused graphs/step (N -> 2N steps)")
    needs_frame = True

    NODE_GROWTH = 0.5  # nodes/step
    SAVED_GROWTH = 1024.0  # bytes/step
    WASTED_RETAIN = 0.5  # retain_graph=True backward calls never reused, per step

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[tuple, list] = {}  # key -> [refcount, nbytes]
        self.live_bytes = 0
        self.peak_bytes = 0
        self.packed_total = 0
        self._calls: list[_BackwardCall] = []
        self._current: Optional[int] = None
        self.end: dict[str, Any] = {}
        self._t0 = 0.0
        self.seconds = 0.0

    # saved tensor accounting -------------------------------------------------------------------
    def _release(self, key: tuple) -> None:
        entry = self._live.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] <= 0:
            self.live_bytes -= entry[1]
            del self._live[key]

    def _pack(self, t: torch.Tensor) -> Any:
        if t.requires_grad and t.grad_fn is None:  # parameter or other leaf: alive anyway
            return t
        try:
            storage = t.untyped_storage()
            key = (str(t.device), storage.data_ptr(), storage.nbytes())
            nbytes = storage.nbytes()
        except Exception:  # sparse / meta / exotic tensors
            return t
        # detach: holding a saved *output* with its grad_fn would make a reference cycle
        # (node -> saved variable -> tensor -> node) that a retained graph never breaks;
        # autograd restores the autograd metadata of what unpack returns.
        packed = _Packed(t.detach(), key)
        entry = self._live.get(key)
        if entry is None:
            self._live[key] = [1, nbytes]
            self.live_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        else:
            entry[0] += 1
        self.packed_total += 1
        weakref.finalize(packed, self._release, key)
        return packed

    def _unpack(self, packed: Any) -> Any:
        if not isinstance(packed, _Packed):
            return packed
        cur = self._current
        if cur is not None:
            call = self._calls[cur]
            call.unpacked += 1
            if packed.last_call is not None and packed.last_call != cur:
                self._calls[packed.last_call].reused = True
            packed.last_call = cur
        return packed.t

    def on_backward_begin(self, kind: str, retain: bool, create_graph: bool) -> None:
        self._calls.append(_BackwardCall(retain))
        self._current = len(self._calls) - 1

    def on_backward_end(self, kind: str, result: Any, create_graph: bool) -> None:
        self._current = None

    def on_backward_error(self, kind: str, exc: BaseException) -> None:
        self._current = None

    def _install(self, stack: ExitStack) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack))
        self._t0 = time.perf_counter()
        stack.callback(self._stop_clock)

    def _stop_clock(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
        self.seconds = time.perf_counter() - self._t0

    def on_main_return(self, frame: Any) -> None:
        """Sample nodes, saved bytes, heap and CUDA memory while ``main``'s locals are alive."""
        gc.collect()
        cuda = None
        if self.device.startswith("cuda") and torch.cuda.is_available():
            torch.cuda.synchronize()
            cuda = int(torch.cuda.memory_allocated())
        self.end = {"nodes": count_live_graph_nodes(), "saved_bytes": self.live_bytes,
                    "heap_bytes": host_heap_bytes(), "cuda_allocated": cuda}

    def sample(self) -> dict:
        """End-of-main figures plus peak saved bytes, wasted retains and seconds."""
        wasted = sum(1 for c in self._calls if c.retain and c.unpacked and not c.reused)
        end = dict(self.end) or {"nodes": None, "saved_bytes": self.live_bytes, "heap_bytes": None,
                                 "cuda_allocated": None}
        end.update({"peak_saved_bytes": self.peak_bytes, "packed_total": self.packed_total,
                    "backward_calls": len(self._calls),
                    "retain_calls": sum(1 for c in self._calls if c.retain),
                    "wasted_retain_calls": wasted, "seconds": round(self.seconds, 4)})
        return end

    @classmethod
    def decide(cls, samples: dict[int, dict]) -> Measurement:
        """Growth per step between the runs at N and 2N steps (see the class threshold)."""
        n, n2 = sorted(samples)[:2] if len(samples) >= 2 else (min(samples), min(samples))
        a, b = samples[n], samples[n2]
        span = max(n2 - n, 1)

        def growth(key: str) -> Optional[float]:
            if a.get(key) is None or b.get(key) is None or n2 == n:
                return None
            return (b[key] - a[key]) / span

        nodes = growth("nodes")
        saved = growth("saved_bytes")
        peak = growth("peak_saved_bytes")
        wasted = growth("wasted_retain_calls")
        heap = growth("heap_bytes")
        cuda = growth("cuda_allocated")
        reasons = []
        if nodes is not None and nodes >= cls.NODE_GROWTH:
            reasons.append(f"nodes +{nodes:.1f}/step")
        if saved is not None and saved >= cls.SAVED_GROWTH:
            reasons.append(f"saved tensors {human_bytes(saved, True)}/step")
        if peak is not None and peak >= cls.SAVED_GROWTH:
            reasons.append(f"peak saved tensors {human_bytes(peak, True)}/step")
        if wasted is not None and wasted >= cls.WASTED_RETAIN:
            reasons.append(f"retained-but-unused graphs {wasted:+.1f}/step")
        retained = None
        if heap is not None or cuda is not None:
            retained = (heap or 0.0) + (cuda or 0.0)
        per_step = [v["seconds"] / k for k, v in sorted(samples.items()) if k]
        details = {
            "steps": [n, n2],
            "nodes_per_step": nodes, "saved_bytes_per_step": saved, "peak_saved_bytes_per_step": peak,
            "wasted_retain_per_step": wasted, "heap_bytes_per_step": heap,
            "cuda_allocated_per_step": cuda,
            "seconds_per_step": [round(x, 6) for x in per_step],
            "time_per_step_ratio": round(per_step[-1] / per_step[0], 2) if per_step and per_step[0] > 0 else None,
            "reasons": reasons,
            "runs": {str(k): v for k, v in samples.items()},
        }
        parts = []
        if retained is not None:
            parts.append(f"{human_bytes(retained, True)}/step")
        if nodes is not None:
            parts.append(f"{nodes:+.1f} nodes/step")
        if saved is not None and abs(saved) >= 1:
            parts.append(f"saved {human_bytes(saved, True)}/step")
        if peak is not None and abs(peak) >= cls.SAVED_GROWTH and peak != saved:
            parts.append(f"peak saved {human_bytes(peak, True)}/step")
        if wasted:
            parts.append(f"unused retains {wasted:+.1f}/step")
        display = ", ".join(parts) if parts else "no sample"
        # headline: the largest byte growth seen (end-of-main heap, or saved tensors at their peak,
        # which catches graphs kept alive inside helpers that have returned by the end of main)
        candidates = [v for v in (retained, peak) if v is not None]
        figure = max(candidates) if candidates else float(saved or 0.0)
        return Measurement(cls.name, float(figure), cls.unit, display, cls.threshold, bool(reasons), details)


# --------------------------------------------------------------------------------------------------
# TGL201: module mode
# --------------------------------------------------------------------------------------------------


class ModuleModeProbe(Probe):
    """Dropout / batch-norm modules running in training mode while grad mode is off.

    Global forward pre-hooks and hooks
    (:func:`torch.nn.modules.module.register_module_forward_pre_hook` /
    ``register_module_forward_hook``) see every module call. A call counts when the
    module is a dropout with ``p > 0`` (``_DropoutNd``) or a normalization layer with
    running statistics (``_NormBase`` with ``track_running_stats``), ``module.training``
    is ``True`` and ``torch.is_grad_enabled()`` is ``False`` (no_grad or inference
    mode). For batch norm the running statistics are compared before and after the call.

    Figure: such calls (count) in the run at N. Threshold: defect when >= 1.
    """

    name = "module-mode"
    rules = ("TGL201",)
    unit = "calls"
    threshold = ">= 1 dropout/batch-norm call in training mode while grad mode is off"

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.dropout_calls = 0
        self.norm_calls = 0
        self.stats_changed = 0
        self.modules: set[str] = set()
        self._before: dict[int, list] = {}

    @staticmethod
    def _kind(module: torch.nn.Module) -> Optional[str]:
        from torch.nn.modules.batchnorm import _NormBase
        from torch.nn.modules.dropout import _DropoutNd

        if isinstance(module, _DropoutNd) and module.p > 0:
            return "dropout"
        if isinstance(module, _NormBase) and module.track_running_stats:
            return "norm"
        return None

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        if not module.training or torch.is_grad_enabled():
            return None
        kind = self._kind(module)
        if kind is None:
            return None
        self.calls += 1
        self.modules.add(type(module).__name__)
        if kind == "dropout":
            self.dropout_calls += 1
        else:
            self.norm_calls += 1
            self._before[id(module)] = [b.detach().clone() for b in (module.running_mean, module.running_var)
                                        if b is not None]
        return None

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        before = self._before.pop(id(module), None)
        if before is None:
            return None
        after = [b for b in (module.running_mean, module.running_var) if b is not None]
        if any(not torch.equal(x, y) for x, y in zip(before, after)):
            self.stats_changed += 1
        return None

    def _install(self, stack: ExitStack) -> None:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        stack.callback(register_module_forward_pre_hook(self._pre).remove)
        stack.callback(register_module_forward_hook(self._post).remove)

    def sample(self) -> dict:
        """Counts of train-mode calls under no_grad, by kind, and batch-norm updates."""
        return {"calls": self.calls, "dropout_calls": self.dropout_calls, "norm_calls": self.norm_calls,
                "running_stats_changed": self.stats_changed, "modules": sorted(self.modules)}

    @classmethod
    def decide(cls, samples: dict[int, dict]) -> Measurement:
        """Defect iff a run has >= 1 train-mode dropout/batch-norm call with grad mode off."""
        s = samples[min(samples)]
        defect = any(v["calls"] >= 1 for v in samples.values())
        display = f"train-mode calls under no_grad: {s['calls']}"
        if s["norm_calls"]:
            display += f" (running stats changed in {s['running_stats_changed']})"
        return Measurement(cls.name, float(s["calls"]), cls.unit, display, cls.threshold, defect,
                           {"runs": {str(k): v for k, v in samples.items()}})


PROBES: dict[str, type[Probe]] = {p.name: p for p in
                                  (StaleGradientProbe, GradModeProbe, RetainedGraphProbe, ModuleModeProbe)}

from . import probes_numerics  # noqa: E402,F401 - registers its probes in PROBES
