"""Probes: small runtime sanitizers built on torch's own instrumentation (imports torch).

A probe is installed from outside the program it watches (a fixture never measures
itself; ``torchgradlint run`` installs it around a user's script). One instance
observes one run; :meth:`Probe.sample` returns its JSON-able figures; the class
method :meth:`Probe.decide` turns the samples of several step counts into a
:class:`Measurement`: a headline figure with its unit, the stated threshold, whether
the run is defective, and :class:`findings <Measurement>` — each measured defect with
its rule code and the user's call stack where it happened (innermost first), so a
defect can be matched with the line the linter reports.

The harness runs each fixture at N, 2N (and 4N for ``retained-graph``) steps, one
run per step count; ``torchgradlint run`` samples one long run at checkpoints.

=================  ===========  ==========================================================
probe              rules        defect when
=================  ===========  ==========================================================
stale-gradients    TGL001       >= 1 optimizer step (per optimizer, per parameter group)
                                whose gradients a backward added onto gradients that an
                                earlier step of the same optimizer already consumed
grad-mode          TGL002       >= 1 grad-mode failure at a backward / autograd.grad call:
                                autograd's "does not require grad" error on a tensor made
                                under no_grad/inference_mode, a backward that reaches no
                                parameter after a no_grad forward, or a create_graph result
                                that contributes no gradient
retained-graph     TGL101,      TGL102: >= 0.5 graphs/step kept by retain_graph=True alive
                   TGL102       at the next forward and never backpropagated again, or
                                graph growth through graphs backpropagated again
                                (carried state); TGL101: graph nodes grow >= 0.1 node/step
                                or saved tensors grow >= 256 B/step (least-squares slope
                                over N, 2N, 4N steps, growing from N to 4N; the peak,
                                a high-water mark, still rising over the last interval)
module-mode        TGL201       >= 1 dropout (p > 0, functional, module, attention or
                                SDPA dropout_p) or batch-norm call in training mode while
                                grad mode is off, outside update_bn, outside a model
                                in eval mode, and outside Monte-Carlo sampling after an
                                explicit train() (dropout only, one input >= 2 times,
                                no backward while the switch holds)
=================  ===========  ==========================================================
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import re
import sys
import time
import weakref
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

import torch

from . import instrument
from .holders import graph_holders, graph_leaves, holder_parts, keeping_lines, reachable_nodes, tensors_in
from .interrupts import no_raise
from .module_calls import CALLS
from .probe_base import (KIB, Measurement, Probe, finding, grad_mark, human_bytes, own_parameters, slope,
                         unchanged)

__all__ = ["KIB", "Measurement", "Probe", "finding", "human_bytes", "slope", "PROBES", "StaleGradientProbe",
           "GradModeProbe", "RetainedGraphProbe", "ModuleModeProbe"]

_finding = finding


# --------------------------------------------------------------------------------------------------
# TGL001: stale gradients
# --------------------------------------------------------------------------------------------------


def _holds(g: Optional[torch.Tensor], mark: Optional[tuple]) -> bool:
    """Whether gradient ``g`` still holds the sum ``mark`` (a :func:`.probe_base.grad_mark`) recorded.

    The same tensor, unchanged or changed in place without being zeroed: ``scaler.unscale_(opt)``
    and ``clip_grad_norm_`` scale every gradient in place between the backward and the step
    (nanoGPT, cleanrl), which bumps its version counter but keeps the sum. A gradient zeroed in
    place (``zero_grad(set_to_none=False)``, ``p.grad.zero_()``) holds none: told by one reduction,
    run only when the version moved.
    """
    if g is None or mark is None or mark[0]() is not g:
        return False
    return g._version == mark[1] or bool(g.detach().ne(0).any())


class StaleGradientProbe(Probe):
    """Optimizer steps that consume gradients summed onto gradients an earlier step consumed.

    No gradient is copied: a gradient's contents are identified by a weak reference to
    the tensor and its version counter (every in-place change, ``zero_()`` included,
    bumps the counter; ``zero_grad()``'s default sets it to ``None``).

    * global optimizer step hooks: after each ``step()`` every parameter's gradient
      state is recorded as *consumed*;
    * per parameter a gradient hook (before ``AccumulateGrad``) sees whether a backward
      is about to add into a consumed (or already stale) gradient, and a
      post-accumulate-grad hook records the resulting *stale* state (a
      ``torch.autograd.grad`` pass, which fires the hook but accumulates nothing, is
      ignored);
    * before each ``step()``, per parameter group, the step is *stale* when a
      parameter's gradient is still in a stale state, or is the same tensor scaled in
      place since (``unscale_``, ``clip_grad_norm_``) and not zeroed.

    Gradients handed over by reference: an A3C worker backpropagates through a local
    model and points the shared model's gradients at the local ones
    (``shared_param._grad = param.grad``) before the shared optimizer steps. From the
    second step on, a stepped parameter whose gradient its own accumulation did not
    make is looked up once among the live leaf tensors (one pass over
    ``gc.get_objects()``): the leaves holding that very tensor as ``.grad`` are its
    *owners*, hooked like stepped parameters; a step consumes its owners' gradients
    too, and is stale when an owner's gradient is.

    Attribution: per optimizer and parameter group, at the user's call stack of the
    first stale ``step()`` (``scaler.step(opt)`` names the user's line).
    Figure: stale-gradient steps out of all steps of the optimizer with the most.
    Threshold: defect when >= 1 stale-gradient step (the first step can never be stale).
    """

    name = "stale-gradients"
    unit = "steps"
    threshold = (">= 1 step of an optimizer (per parameter group) consumed gradients that a backward added "
                 "onto gradients an earlier step of it already used")

    def __init__(self) -> None:
        super().__init__()
        self._consumed: dict[int, Optional[tuple]] = {}
        self._stale: dict[int, Optional[tuple]] = {}
        self._about: set[int] = set()
        self._hooks: dict[int, list] = {}
        self._made: dict[int, int] = {}  # parameter -> id() of the gradient its last accumulation left
        self._owners: dict[int, list] = {}  # stepped parameter -> weak references to the leaves it shares .grad with
        self._looked_up: set[int] = set()  # stepped parameters whose owners were looked for
        # optimizer -> its label, by the object (an ``id`` is reused by the next optimizer built at that
        # address: a loop that builds one per iteration then read as fewer optimizers)
        self._labels: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
        self._counts: dict[str, int] = {}
        self.groups: dict[str, dict] = {}
        # whether the running pass accumulates into ``.grad``: ``torch.autograd.grad`` fires the
        # parameters' gradient hooks too but adds nothing (a Fisher statistics pass before a reset)
        self._accumulating = True

    def on_backward_begin(self, kind: str, roots: tuple, retain: bool, create_graph: bool) -> None:
        self._about.clear()
        self._accumulating = kind == "backward"

    def on_backward_end(self, kind: str, result: Any, create_graph: bool) -> None:
        self._accumulating = True

    def on_backward_error(self, kind: str, exc: BaseException) -> None:
        self._accumulating = True

    def _install(self, stack: ExitStack) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        stack.callback(register_optimizer_step_pre_hook(self._pre_step).remove)
        stack.callback(register_optimizer_step_post_hook(self._post_step).remove)
        stack.callback(self._remove_param_hooks)

    def _remove_param_hooks(self) -> None:
        for handles in self._hooks.values():
            for h in handles:
                h.remove()
        self._hooks.clear()

    def _label(self, optimizer: Any) -> str:
        try:
            label = self._labels.get(optimizer)
        except TypeError:  # pragma: no cover - an optimizer class without weak references
            return f"{type(optimizer).__name__}#{id(optimizer)}"
        if label is None:
            kind = type(optimizer).__name__
            self._counts[kind] = self._counts.get(kind, 0) + 1
            label = self._labels[optimizer] = f"{kind}#{self._counts[kind]}"
        return label

    def _hook(self, p: torch.Tensor) -> None:
        pid = id(p)
        if pid in self._hooks or not p.requires_grad:
            return
        ref = weakref.ref(p)

        def before(grad: torch.Tensor) -> None:
            param = ref()
            if param is not None and self._accumulating:
                g = param.grad
                if unchanged(g, self._consumed.get(pid)):
                    self._about.add(pid)  # adding onto what a step used, untouched since
                elif pid in self._stale:
                    if _holds(g, self._stale[pid]):
                        self._about.add(pid)  # adding onto a stale sum
                    else:
                        del self._stale[pid]  # reset (set to None, replaced, zeroed) since
            return None

        def after(param: torch.Tensor) -> None:
            self._made[pid] = id(param.grad)
            if pid in self._about:
                self._about.discard(pid)
                self._stale[pid] = grad_mark(param.grad)

        self._hooks[pid] = [p.register_hook(before), p.register_post_accumulate_grad_hook(after)]

    def _handed_over(self, optimizer: Any) -> None:
        """Find the owners of the gradients handed to ``optimizer``'s parameters (see the class
        docstring): each parameter is looked up once, all of a step's in one pass."""
        wanted: dict[int, list[int]] = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                pid = id(p)
                if not isinstance(p, torch.Tensor) or pid in self._looked_up or pid not in self._hooks:
                    continue  # hooked at this step: its own accumulations were not watched yet
                g = p.grad
                if g is not None and self._made.get(pid) != id(g):
                    self._looked_up.add(pid)
                    wanted.setdefault(id(g), []).append(pid)
        if not wanted:
            return
        for obj in live_tensors():
            try:
                g = obj.grad if obj.is_leaf and obj.requires_grad else None
            except Exception:  # pragma: no cover - exotic tensor subclasses
                continue
            for pid in wanted.get(id(g), ()) if g is not None else ():
                if id(obj) != pid:
                    self._hook(obj)
                    self._owners.setdefault(pid, []).append(weakref.ref(obj))

    def _owned(self, p: torch.Tensor) -> list:
        """The live owners of ``p``'s gradient (leaves whose ``.grad`` is the same tensor)."""
        refs = self._owners.get(id(p))
        if not refs:
            return []
        g = p.grad
        return [o for r in refs if (o := r()) is not None and g is not None and o.grad is g]

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        label = self._label(optimizer)
        stack = None
        self._handed_over(optimizer)
        for gi, group in enumerate(optimizer.param_groups):
            stale = 0
            for p in group["params"]:
                if not isinstance(p, torch.Tensor):
                    continue
                self._hook(p)
                if _holds(p.grad, self._stale.get(id(p))) or any(
                        _holds(p.grad, self._stale.get(id(o))) for o in self._owned(p)):
                    stale += 1
            rec = self.groups.setdefault(f"{label} group {gi}", {"steps": 0, "stale_steps": 0,
                                                                  "stale_params": 0, "stack": []})
            rec["steps"] += 1
            if stale:
                rec["stale_steps"] += 1
                rec["stale_params"] = max(rec["stale_params"], stale)
                if not rec["stack"]:
                    stack = stack or instrument.user_stack()
                    rec["stack"] = [list(s) for s in stack]

    def _post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if isinstance(p, torch.Tensor):
                    self._consumed[id(p)] = grad_mark(p.grad)
                    self._stale.pop(id(p), None)
                    for o in self._owned(p):
                        self._consumed[id(o)] = grad_mark(o.grad)
                        self._stale.pop(id(o), None)

    def sample(self) -> dict:
        """``groups``: per optimizer and parameter group, steps, stale steps and the first stale stack."""
        return {"groups": {k: dict(v) for k, v in self.groups.items()}}

    @classmethod
    def decide(cls, samples: dict[int, dict]) -> Measurement:
        """Defect iff a run has >= 1 stale-gradient step in some group; figures from the run at N."""
        n = min(samples)
        groups = samples[n]["groups"]
        findings = []
        for label, g in sorted(groups.items()):
            if g["stale_steps"]:
                findings.append(_finding("TGL001", g["stack"], float(g["stale_steps"]), cls.unit,
                                         f"{label}: stale-gradient steps {g['stale_steps']}/{g['steps']}"))
        defect = any(g["stale_steps"] >= 1 for s in samples.values() for g in s["groups"].values())
        worst = max(groups.items(), key=lambda kv: (kv[1]["stale_steps"], kv[1]["steps"]), default=None)
        if worst is None:
            display, figure = "stale-gradient steps: 0/0 (no optimizer step)", 0.0
        else:
            g = worst[1]
            figure = float(g["stale_steps"])
            display = f"stale-gradient steps: {g['stale_steps']}/{g['steps']}"
            if len(groups) > 1:
                display += f" ({worst[0]}; {len(groups)} groups)"
        return Measurement(cls.name, figure, cls.unit, display, cls.threshold, defect,
                           findings=findings, details={"runs": {str(k): v for k, v in samples.items()}})


# --------------------------------------------------------------------------------------------------
# TGL002: grad-mode failures
# --------------------------------------------------------------------------------------------------

GRAD_MODE_ERRORS = re.compile(
    r"does not require grad|does not have a grad_fn|differentiated Tensors? (?:appears|does) not|"
    r"Inference tensors cannot be saved for backward|element \d+ of tensors does not require grad",
    re.IGNORECASE,
)


def _reaches_parameter(roots: Sequence[Any]) -> bool:
    """Whether the graphs of ``roots`` reach an ``nn.Parameter`` (stops at the first one)."""
    return any(isinstance(t, torch.nn.Parameter) for t in roots) \
        or any(isinstance(v, torch.nn.Parameter) for v in graph_leaves(roots))


def _decorated_stack() -> list:
    """The user's frames of the current call (innermost first), each frame that a
    ``@torch.no_grad()``/``@torch.inference_mode()`` decorator runs preceded by the
    decorator's line (``co_firstlineno`` of a decorated function)."""
    out: list = []
    for f in instrument.user_frames(6, sys._getframe(1)):
        name = f.f_code.co_filename
        path = name if name.startswith("<") else os.path.abspath(name)
        out.append([path, f.f_lineno])
        if f.f_back is not None and f.f_back.f_code.co_name == "decorate_context":
            out.append([path, f.f_code.co_firstlineno])
    return out


class GradModeProbe(Probe):
    """Grad-mode failures of backward / ``torch.autograd.grad``, attributed to the call.

    Three kinds, all seen at the backward or ``autograd.grad`` call (an error raised
    anywhere else, whatever its text, is not claimed):

    1. autograd raises "does not require grad" / "does not have a grad_fn" and grad mode
       is why: a root is an inference tensor, grad mode is off at the call, or a module
       with trainable parameters ran while grad mode was off since the last backward
       (a ``.detach()`` bug, with every forward under grad mode, is not claimed);
    2. a silent failure: a backward whose graph reaches no parameter (e.g.
       ``requires_grad_()`` on a result computed under no_grad) after a module with
       trainable parameters ran while grad mode was off;
    3. a ``torch.autograd.grad(..., create_graph=True)`` result that carries no graph, or
       that the backward run next does not propagate through (a penalty computed under
       no_grad in a training step); a result after which the next autograd call is not a
       backward (an evaluation that computes the penalty as a metric) is not claimed;
    4. parameters that require grad and that an optimizer steps, of a module that ran with
       grad mode off, never get a gradient in the whole run (a module whose ``forward`` is
       decorated ``@torch.no_grad()`` after it was unfrozen). Attributed to the module call
       and, when a ``@no_grad``/``@inference_mode`` decorator disabled grad, to that decorator.

    Figure: grad-mode failures (count) in the run at N. Threshold: defect when >= 1.
    """

    name = "grad-mode"
    unit = "failures"
    threshold = (">= 1 grad-mode failure at a backward/autograd.grad call: 'does not require grad' on a tensor made "
                 "with grad mode off, a backward reaching no parameter after a no_grad forward, or a create_graph "
                 "result contributing no gradient")

    def __init__(self) -> None:
        super().__init__()
        self.events: list[dict] = []
        self.other_errors: list[str] = []
        self.calls = 0
        self._seen: set[int] = set()
        self._nograd_forward: Optional[list] = None
        self._roots: tuple = ()
        self._graph_used: list[list] = []  # [used, stack, followed by a backward]
        self._awaiting: list[list] = []  # create_graph results since the last autograd call
        self._nograd_params: dict[int, list] = {}  # id(parameter) -> stack of its first grad-off forward
        self._stepped: set[int] = set()  # parameters an optimizer stepped
        self._got_grad: set[int] = set()  # ... that had a gradient at some step

    def _install(self, stack: ExitStack) -> None:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        CALLS.subscribe(stack, each_pre=self._pre_forward)
        stack.callback(register_optimizer_step_pre_hook(self._pre_step).remove)

    def _pre_forward(self, module: torch.nn.Module, args: Any) -> None:
        if not torch.is_grad_enabled():
            trainable = [p for p in own_parameters(module) if p.requires_grad]
            if self._nograd_forward is None and (trainable or any(p.requires_grad for p in module.parameters())):
                self._nograd_forward = [list(s) for s in instrument.user_stack(3)]
            fresh = [p for p in trainable if id(p) not in self._nograd_params]
            if fresh:
                where = _decorated_stack()
                for p in fresh:
                    self._nograd_params[id(p)] = where
        return None

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._nograd_params:
            return
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    self._stepped.add(id(p))
                    if p.grad is not None:
                        self._got_grad.add(id(p))

    def _event(self, kind: str, text: str) -> None:
        self.events.append({"kind": kind, "text": text, "stack": [list(s) for s in instrument.user_stack()],
                            "cause": self._nograd_forward})

    def on_backward_begin(self, kind: str, roots: tuple, retain: bool, create_graph: bool) -> None:
        self.calls += 1
        self._roots = roots
        for rec in self._awaiting:  # the autograd call right after a create_graph result
            rec[2] = kind == "backward"
        self._awaiting = []
        if kind == "backward" and self._nograd_forward is not None and roots \
                and all(isinstance(t, torch.Tensor) and t.requires_grad for t in roots) \
                and not _reaches_parameter(roots):
            self._event("silent", "backward reaches no parameter: its forward ran with grad mode off")

    def on_backward_end(self, kind: str, result: Any, create_graph: bool) -> None:
        self._nograd_forward = None
        self._roots = ()
        if kind == "grad" and create_graph and result is not None and not instrument.called_from_library():
            for t in result:
                if not isinstance(t, torch.Tensor):
                    continue
                if not t.requires_grad:
                    self._event("graphless", "create_graph result carries no graph")
                    continue
                rec = [False, [list(s) for s in instrument.user_stack()], False]
                self._graph_used.append(rec)
                self._awaiting.append(rec)
                t.register_hook(self._make_used_hook(rec))

    @staticmethod
    def _make_used_hook(rec: list) -> Callable:
        def hook(grad: torch.Tensor) -> None:
            rec[0] = True
            return None

        return hook

    def _cause(self) -> Optional[str]:
        if any(isinstance(t, torch.Tensor) and t.is_inference() for t in self._roots):
            return "inference tensor"
        if not torch.is_grad_enabled():
            return "grad mode off at the call"
        if self._nograd_forward is not None:
            return "forward ran with grad mode off"
        return None

    def on_backward_error(self, kind: str, exc: BaseException) -> None:
        text = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        if isinstance(exc, RuntimeError) and GRAD_MODE_ERRORS.search(str(exc)):
            cause = self._cause()
            if cause is not None:
                self._seen.add(id(exc))
                self._event("error", text)
                self.events[-1]["why"] = cause
            else:
                self.other_errors.append(text)
        self._roots = ()

    def on_exception(self, exc: BaseException) -> bool:
        return id(exc) in self._seen

    def sample(self) -> dict:
        """``events`` (kind, text, stack, cause), autograd ``calls``, errors not claimed."""
        events = list(self.events)
        untrained: dict[str, list] = {}
        for pid, stack in self._nograd_params.items():
            if pid in self._stepped and pid not in self._got_grad:
                untrained.setdefault(repr(stack), [stack, 0])[1] += 1
        for stack, n in untrained.values():
            events.append({"kind": "untrained", "stack": stack, "cause": None,
                           "text": f"{n} stepped parameter tensor(s) of a module run with grad mode off never got a "
                                   "gradient"})
        for used, stack, followed in self._graph_used:
            if followed and not used:
                events.append({"kind": "unused", "text": "create_graph result contributing no gradient",
                               "stack": stack, "cause": None})
        return {"events": events, "calls": self.calls, "other_errors": list(self.other_errors),
                "create_graph_results": len(self._graph_used)}

    @classmethod
    def decide(cls, samples: dict[int, dict]) -> Measurement:
        """Defect iff a run has >= 1 grad-mode failure; one finding per distinct call stack."""
        s = samples[min(samples)]
        events = s["events"]
        defect = any(v["events"] for v in samples.values())
        by_stack: dict[str, list] = {}
        for e in events:
            by_stack.setdefault(repr(e["stack"]), []).append(e)
        findings = [_finding("TGL002", es[0]["stack"], float(len(es)), cls.unit,
                             es[0]["text"] + (f" (x{len(es)})" if len(es) > 1 else ""))
                    for es in by_stack.values()]
        if events:
            display = events[0]["text"] + (f" (+{len(events) - 1} more)" if len(events) > 1 else "")
        else:
            display = f"grad-mode failures: 0 ({s['calls']} backward/grad calls)"
        return Measurement(cls.name, float(len(events)), cls.unit, display, cls.threshold, defect,
                           findings=findings, details={"runs": {str(k): v for k, v in samples.items()}})


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
    """Bytes in use by the C heap (glibc ``mallinfo2``: ``uordblks + hblkhd``); ``None`` elsewhere."""
    return _heap_in_use() if _heap_in_use is not None else None


def count_live_graph_nodes() -> int:
    """Autograd nodes reachable from every live tensor (``gc`` over tensors with a ``grad_fn``).

    Cost: one pass over ``gc.get_objects()`` (~0.1 s); the harness uses it, ``run`` does not.
    """
    fns = []
    for obj in live_tensors():
        try:
            fn = obj.grad_fn
        except Exception:  # pragma: no cover - exotic tensor subclasses
            continue
        if fn is not None:
            fns.append(fn)
    return reachable_nodes(fns, {})


def live_tensors() -> Iterator[torch.Tensor]:
    """Every tensor the cyclic collector tracks (one pass over ``gc.get_objects()``; the type is
    tested with ``issubclass(type(obj), ...)``, which reads no attribute of lazy module proxies)."""
    tensor_type = torch.Tensor
    for obj in gc.get_objects():
        if issubclass(type(obj), tensor_type):
            yield obj


def view_span(t: torch.Tensor) -> int:
    """Bytes a tensor view spans in its storage: from its first to its last element (0 if empty)."""
    if t.numel() == 0:
        return 0
    extent = 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))
    return extent * t.element_size()


class _SavedLeaf:
    """A saved parameter (or other leaf): alive anyway, so not accounted; kept with its
    version counter at save time, which autograd does not check for tensors that pass
    through saved-tensor hooks."""

    __slots__ = ("t", "version")

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t
        self.version = t._version


def _modified_in_place(t: torch.Tensor, saved: int) -> RuntimeError:
    """The error autograd raises for a saved tensor modified in place since it was saved."""
    return RuntimeError(
        f"one of the variables needed for gradient computation has been modified by an inplace operation: "
        f"[{t.type()} {list(t.shape)}] is at version {t._version}; expected version {saved} instead.")


class _Packed:
    """A saved tensor as autograd holds it while the probe watches; tells the probe when autograd lets it go
    (``__del__``: a third of the cost of a :func:`weakref.finalize` per saved tensor)."""

    __slots__ = ("t", "version", "span", "last_call", "release", "skey", "vkey", "__weakref__")

    def __init__(self, t: torch.Tensor, span: int, release: Callable[[tuple, tuple], None], skey: tuple,
                 vkey: tuple, version: int) -> None:
        self.t = t
        self.version = version  # the tensor's version counter when autograd saved it
        self.span = span
        self.last_call: Optional[int] = None
        self.release, self.skey, self.vkey = release, skey, vkey

    @no_raise
    def __del__(self) -> None:
        try:
            self.release(self.skey, self.vkey)
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


@dataclass
class _BackwardCall:
    retain: bool
    stack: list
    refs: list = field(default_factory=list)
    unpacked: int = 0
    reused: bool = False
    alive_at_next: int = -1  # bytes of its saved tensors alive at the next forward (-1: not checked)


def _all_holders(sample: dict) -> dict:
    """Holders of a sample's end-of-main and in-run checkpoints; the larger node count wins."""
    out = dict(sample.get("inrun", {}).get("holders", {}))
    for key, h in sample.get("holders", {}).items():
        if key not in out or h["nodes"] >= out[key]["nodes"]:
            out[key] = h
    return out


class RetainedGraphProbe(Probe):
    """Graphs and saved tensors kept alive across steps, and graphs retained for nothing.

    Instrumentation (all from outside the program):

    * :class:`torch.autograd.graph.saved_tensors_hooks`: every tensor autograd saves
      is wrapped; the wrapper's ``__del__`` accounts its release. Live *saved bytes*
      count the bytes each saved view spans in its storage (:func:`view_span`); views of
      one storage count at most the storage's size; parameters are not counted.
    * per backward / ``autograd.grad`` call: the saved tensors it unpacked; for a call
      with ``retain_graph=True``, at the next saved tensor packed after it (the next
      forward), the bytes of its saved tensors still alive, and whether a later backward
      unpacks them again (reused).
    * checkpoints (the end of a fixture's ``main``; in ``run`` every backward call whose
      count is 2, 4, 8, ..., or, in a program without backward, every such top-level model
      call): graph nodes reachable from each variable of the user's frames
      (:func:`.holders.graph_holders`), live saved bytes and, in the harness, every live graph node (:func:`count_live_graph_nodes`) and CUDA memory.

    Decision over checkpoints at N, 2N, 4N steps (least-squares slope, and the value at
    4N above the value at N; the peak saved bytes, a high-water mark that never falls, must
    also rise from 2N to 4N: a peak that rises in the first iterations and then levels off
    is not growth; with more checkpoints (``run``), every figure must still rise over the
    last two intervals: checkpoints taken within an optimizer step see one step's
    micro-batch graphs fill up and then stay level):
    TGL102 when >= 0.5 retained graphs/step are alive at the next forward and never
    reused, or when graphs grow (below) while retained graphs are backpropagated
    again (state carried across iterations), attributed to the retaining call; and
    when a backward raises "modified by an inplace operation" after an optimizer
    step that ran between it and a ``retain_graph=True`` backward (the retained
    graph's saved weights were stepped in place), attributed to the retaining call;
    TGL101 when graph nodes grow >= 0.1 node/step or saved tensors >= 256 B/step (or
    saved tensors at their peak >= 1 KiB/step), attributed to the variable whose
    graph grows and the line that stores into it (a variable rebound from its own value, with
    no line that stores into it, is carried state: listed in ``details["carried_state"]``, not
    TGL101).
    """

    name = "retained-graph"
    unit = "B/step"
    threshold = ("TGL102: >= 0.5 graphs/step kept by retain_graph=True alive at the next forward and never reused, "
                 "growth while retained graphs are reused, or a backward through a retained graph whose saved weights "
                 "an optimizer step changed in between ('modified by an inplace operation'); TGL101: graph nodes >= 0.1 node/step or saved tensors "
                 ">= 256 B/step (peak >= 1 KiB/step): least-squares slope over N, 2N, 4N steps")
    needs_frame = True
    schedule = (1, 2, 4)

    NODE_GROWTH = 0.1  # nodes/step
    SAVED_GROWTH = 256.0  # bytes/step
    PEAK_GROWTH = 1024.0  # bytes/step
    WASTED_RETAIN = 0.5  # retained graphs alive at the next forward and never reused, per step

    def __init__(self, full_scan: bool = True) -> None:
        super().__init__()
        self.full_scan = full_scan
        self._views: dict[tuple, dict[tuple, list]] = {}  # storage -> view -> [refcount, span]
        self._counted: dict[tuple, int] = {}  # storage -> bytes counted
        self._capacity: dict[tuple, int] = {}
        self.live_bytes = 0
        self.peak_bytes = 0
        self.packed_total = 0
        self._calls: dict[int, _BackwardCall] = {}  # retain_graph=True calls only, by call number
        self._ncalls = 0
        self._pending: list[int] = []
        self._current: Optional[int] = None
        self.end: dict[str, Any] = {}
        self.inrun: dict[str, Any] = {}
        self._lines: dict[tuple, list] = {}
        self._t0 = 0.0
        self.seconds = 0.0
        # retain_graph=True backwards since the last backward without it: [stack, an optimizer step ran since]
        self._retained: list[list] = []
        self.stale: list[dict] = []  # backwards that raised through saved weights stepped in place
        self._claimed: set[int] = set()

    # saved tensor accounting -------------------------------------------------------------------
    def _recount(self, skey: tuple) -> None:
        views = self._views.get(skey)
        new = min(self._capacity.get(skey, 0), sum(v[1] for v in views.values())) if views else 0
        self.live_bytes += new - self._counted.get(skey, 0)
        if views:
            self._counted[skey] = new
        else:
            self._counted.pop(skey, None)
            self._views.pop(skey, None)
            self._capacity.pop(skey, None)
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes

    def _release(self, skey: tuple, vkey: tuple) -> None:
        views = self._views.get(skey)
        if views is None or vkey not in views:
            return
        views[vkey][0] -= 1
        if views[vkey][0] <= 0:
            del views[vkey]
        self._recount(skey)

    def _pack(self, t: torch.Tensor) -> Any:
        if self._pending:
            self._check_pending()
        if t.requires_grad and t.grad_fn is None:  # parameter or other leaf: alive anyway
            return _SavedLeaf(t)
        try:
            size = t.element_size()
            offset = t.storage_offset()
            # the storage's address from the tensor's own (no storage object unless the storage is new)
            skey = (t.device, t.data_ptr() - offset * size)
            capacity = self._capacity.get(skey)
            if capacity is None:
                capacity = self._capacity[skey] = t.untyped_storage().nbytes()
            vkey = (offset, tuple(t.shape), tuple(t.stride()), size)
            span = min(view_span(t), capacity)
        except Exception:  # sparse / meta / exotic tensors
            return t
        # detach: holding a saved *output* with its grad_fn would make a reference cycle
        # (node -> saved variable -> tensor -> node) that a retained graph never breaks;
        # autograd restores the autograd metadata of what unpack returns.
        packed = _Packed(t.detach(), span, self._release, skey, vkey, t._version)
        views = self._views.setdefault(skey, {})
        entry = views.get(vkey)
        if entry is None:
            views[vkey] = [1, span]
            self._recount(skey)
        else:
            entry[0] += 1
        self.packed_total += 1
        return packed

    def _stale(self, t: torch.Tensor, saved: int) -> RuntimeError:
        """Autograd skips its version check for tensors that pass through saved-tensor hooks:
        the probe makes it, so that the program fails as it does without the probe; a
        failure after an optimizer step that followed a ``retain_graph=True`` backward is
        this probe's defect."""
        exc = _modified_in_place(t, saved)
        stepped = [stack for stack, after_step in self._retained if after_step]
        if stepped:  # attributed to the earliest retaining backward an optimizer step followed
            self._claimed.add(id(exc))
            self.stale.append({"stack": stepped[0], "text": f"RuntimeError: {str(exc).split(': [', 1)[0]}",
                               "at": [list(s) for s in instrument.user_stack()]})
        return exc

    def _unpack(self, packed: Any) -> Any:
        if not isinstance(packed, (_Packed, _SavedLeaf)):
            return packed
        if packed.t._version != packed.version:
            raise self._stale(packed.t, packed.version)
        if isinstance(packed, _SavedLeaf):
            return packed.t
        cur = self._current
        if cur is not None:
            call = self._calls.get(cur)
            if call is not None:
                call.unpacked += 1
                call.refs.append(weakref.ref(packed))
            if packed.last_call is not None and packed.last_call != cur:
                earlier = self._calls.get(packed.last_call)
                if earlier is not None:
                    earlier.reused = True
            packed.last_call = cur
        return packed.t

    def _check_pending(self) -> None:
        for idx in self._pending:
            call = self._calls[idx]
            alive = [r() for r in call.refs]
            call.alive_at_next = sum(p.span for p in alive if p is not None)
            call.refs = [r for r, p in zip(call.refs, alive) if p is not None]
        self._pending.clear()

    def on_backward_begin(self, kind: str, roots: tuple, retain: bool, create_graph: bool) -> None:
        if self._pending:
            self._check_pending()
        if self.full_scan:  # harness: graphs held by the user's variables at the start of each backward
            self.inrun = self.checkpoint(instrument.user_frames(frame=sys._getframe(1)))
        stack = [list(s) for s in instrument.user_stack()] if retain else []
        self._ncalls += 1
        self._current = self._ncalls
        if retain:
            self._calls[self._current] = _BackwardCall(retain, stack)

    def on_backward_end(self, kind: str, result: Any, create_graph: bool) -> None:
        if self._current in self._calls:
            self._pending.append(self._current)
            self._retained.append([self._calls[self._current].stack, False])
        elif kind == "backward":
            self._retained = []  # a backward without retain_graph frees what it went through
        self._current = None

    def on_backward_error(self, kind: str, exc: BaseException) -> None:
        self._current = None

    def on_exception(self, exc: BaseException) -> bool:
        return id(exc) in self._claimed

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        for rec in self._retained:
            rec[1] = True

    def _install(self, stack: ExitStack) -> None:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
        stack.callback(register_optimizer_step_pre_hook(self._pre_step).remove)
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack))
        self._t0 = time.perf_counter()
        stack.callback(self._stop_clock)

    def _stop_clock(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
        self.seconds = time.perf_counter() - self._t0

    # checkpoints -------------------------------------------------------------------------------
    def checkpoint(self, frames: Sequence[Any]) -> dict:
        """Figures now: graph nodes per user variable in ``frames``, live saved bytes, retain calls."""
        holders = graph_holders(frames)
        out = {}
        for key, n in holders.items():
            path, func, first, name = holder_parts(key)
            code = next((f.f_code for f in frames if f.f_code.co_name == func and f.f_code.co_firstlineno == first),
                        None)
            lk = (id(code), name)
            if lk not in self._lines:
                self._lines[lk] = keeping_lines(code, name) if code is not None else []
            out[key] = {"nodes": n, "lines": self._lines[lk]}
        fns = []
        for f in frames:
            try:
                values = list(f.f_locals.values())
            except Exception:  # pragma: no cover
                continue
            for v in values:
                if isinstance(v, type) or (callable(v) and not isinstance(v, torch.Tensor)):
                    continue
                fns.extend(t.grad_fn for t in tensors_in(v) if t.grad_fn is not None)
        calls = list(self._calls.values())
        wasted = [c for c in calls if c.alive_at_next > 0 and not c.reused]
        return {"holders": out, "holder_nodes": reachable_nodes(fns, {}), "saved_bytes": self.live_bytes,
                "peak_saved_bytes": self.peak_bytes, "backward_calls": self._ncalls,
                "retain_calls": len(calls),
                "reused_retain_calls": sum(1 for c in calls if c.reused),
                "retain_stack": calls[0].stack if calls else [],
                "wasted_retain_calls": len(wasted),
                "wasted_bytes": max((c.alive_at_next for c in wasted), default=0),
                "wasted_stack": wasted[0].stack if wasted else []}

    def on_main_return(self, frame: Any) -> None:
        """Checkpoint while ``main``'s locals are alive (plus every live graph node and CUDA memory)."""
        gc.collect()
        cuda = None
        if self.device.startswith("cuda") and torch.cuda.is_available():
            torch.cuda.synchronize()
            cuda = int(torch.cuda.memory_allocated())
        frames = instrument.user_frames(frame=frame)
        self.end = self.checkpoint(frames)
        self.end.update({"nodes": count_live_graph_nodes() if self.full_scan else None,
                         "heap_bytes": host_heap_bytes(), "cuda_allocated": cuda})

    def sample(self) -> dict:
        """The end-of-main checkpoint plus packed count, wall seconds and (harness) the checkpoint at the
        start of the last backward (``inrun``: graphs held by variables of helpers that have returned since)."""
        end = dict(self.end) or self.checkpoint([])
        end.update({"packed_total": self.packed_total, "seconds": round(self.seconds, 4), "stale": list(self.stale)})
        if self.inrun:
            end["inrun"] = {"holders": self.inrun["holders"], "holder_nodes": self.inrun["holder_nodes"]}
        return end

    @classmethod
    def decide(cls, samples: dict[int, dict]) -> Measurement:
        """Growth over the checkpoints (see the class docstring for the thresholds)."""
        xs = sorted(samples)
        last = samples[xs[-1]]
        stale = [e for x in xs for e in samples[x].get("stale", [])]
        if stale:
            e = stale[0]
            text = "backward through a retained graph after an optimizer step: " + e["text"]
            return Measurement(cls.name, float(len(stale)), "failures", text, cls.threshold, True,
                               findings=[_finding("TGL102", e["stack"], float(len(stale)), "failures", text)],
                               details={"runs": {str(k): v for k, v in samples.items()}})

        def fit(get: Callable[[dict], Optional[float]]) -> Optional[float]:
            pts = [(x, get(samples[x])) for x in xs]
            if any(y is None for _, y in pts):
                return None
            return slope(pts)

        def grows(get: Callable[[dict], Optional[float]], bound: float,
                  high_water: bool = False) -> tuple[Optional[float], bool]:
            # the slope, the last value above the first, and still rising late: a high-water mark
            # (never falls) over the last interval; a live figure over the last two (an
            # epoch-periodic store may read equal at two checkpoints in a row). A figure that rises
            # during warm-up and then levels off (the first iterations' graphs freed later; `run`'s
            # checkpoints within an optimizer step that see one step's micro-batch graphs fill up)
            # is not growth
            s = fit(get)
            return s, s is not None and s >= bound and _still_rising([get(samples[x]) for x in xs],
                                                                     2 if high_water else 3)

        node_key = "nodes" if all(samples[x].get("nodes") is not None for x in xs) else "holder_nodes"
        nodes, nodes_grow = grows(lambda s: s.get(node_key), cls.NODE_GROWTH)
        if all("inrun" in samples[x] for x in xs):
            inrun, inrun_grow = grows(lambda s: s["inrun"]["holder_nodes"], cls.NODE_GROWTH)
            if inrun_grow and not nodes_grow:
                nodes, nodes_grow = inrun, True
        saved, saved_grow = grows(lambda s: s.get("saved_bytes"), cls.SAVED_GROWTH)
        peak, peak_grow = grows(lambda s: s.get("peak_saved_bytes"), cls.PEAK_GROWTH, high_water=True)
        wasted = fit(lambda s: s.get("wasted_retain_calls"))
        heap = fit(lambda s: s.get("heap_bytes"))
        cuda = fit(lambda s: s.get("cuda_allocated"))
        findings: list[dict] = []
        reasons: list[str] = []
        carried: list[str] = []  # variables whose graph grows with no line that stores into them
        growth_bytes = max([v for v in (saved, peak) if v is not None] or [0.0])
        if wasted is not None and wasted >= cls.WASTED_RETAIN:
            reasons.append(f"retained graphs alive at the next forward, never reused {wasted:+.1f}/step")
            findings.append(_finding("TGL102", last.get("wasted_stack"), round(wasted, 2), "graphs/step",
                                     f"{wasted:.1f} retained graph/step alive at the next forward, never "
                                     f"backpropagated again ({human_bytes(last.get('wasted_bytes', 0))} each)"))
        if nodes_grow or saved_grow or peak_grow:
            if nodes_grow:
                reasons.append(f"graph nodes {nodes:+.2f}/step")
            if saved_grow:
                reasons.append(f"saved tensors {human_bytes(saved, True)}/step")
            if peak_grow and not saved_grow:
                reasons.append(f"peak saved tensors {human_bytes(peak, True)}/step")
            what = (f"{nodes:+.1f} graph nodes/step" if nodes_grow else "") + \
                   (", " if nodes_grow and (saved_grow or peak_grow) else "") + \
                   (f"{human_bytes(growth_bytes, True)}/step saved tensors" if saved_grow or peak_grow else "")
            if last.get("reused_retain_calls") and (nodes_grow or saved_grow):
                findings.append(_finding("TGL102", last.get("retain_stack"), round(growth_bytes, 1), cls.unit,
                                         f"graph carried across iterations and backpropagated again with "
                                         f"retain_graph=True: {what}"))
            else:
                growing = []
                held = {x: _all_holders(samples[x]) for x in xs}
                for key in held[xs[-1]]:
                    hs = slope([(x, held[x].get(key, {}).get("nodes", 0)) for x in xs])
                    if hs is not None and hs >= cls.NODE_GROWTH and \
                            _still_rising([held[x].get(key, {}).get("nodes", 0) for x in xs], 3):
                        growing.append((hs, key))
                for hs, key in sorted(growing, reverse=True):
                    path, _, _, name = holder_parts(key)
                    lines = held[xs[-1]][key]["lines"]
                    if not lines:  # rebound from its own value (carried state, `h = cell(x, h)`): no store
                        carried.append(name)  # keeps the graph; not TGL101's stored value
                        continue
                    findings.append(_finding("TGL101", [[path, ln] for ln in lines], round(hs, 2), "nodes/step",
                                             f"`{name}` keeps a growing graph: {hs:+.1f} graph nodes/step"))
                if not growing:
                    findings.append(_finding("TGL101", [], round(growth_bytes or (nodes or 0.0), 1), cls.unit,
                                             f"graphs kept alive across steps: {what}"))
        per_step = [samples[x].get("seconds", 0.0) / x for x in xs if x]
        details = {
            "steps": xs, "node_count": node_key,
            "nodes_per_step": nodes, "saved_bytes_per_step": saved, "peak_saved_bytes_per_step": peak,
            "wasted_retain_per_step": wasted, "heap_bytes_per_step": heap, "cuda_allocated_per_step": cuda,
            "seconds_per_step": [round(x, 6) for x in per_step],
            "time_per_step_ratio": round(per_step[-1] / per_step[0], 2) if per_step and per_step[0] > 0 else None,
            "reasons": reasons, "carried_state": carried,
            "runs": {str(k): v for k, v in samples.items()},
        }
        parts = []
        if saved is not None:
            parts.append(f"saved {human_bytes(saved, True)}/step")
        if nodes is not None:
            parts.append(f"{nodes:+.1f} nodes/step")
        if peak is not None and peak_grow and not saved_grow:
            parts.append(f"peak saved {human_bytes(peak, True)}/step")
        if wasted:
            parts.append(f"unused retained graphs {wasted:+.1f}/step")
        ratio = details["time_per_step_ratio"]
        if ratio is not None and (nodes_grow or saved_grow) and ratio >= 1.5:
            parts.append(f"time/step x{ratio:.1f} from {xs[0]} to {xs[-1]} steps")
        display = ", ".join(parts) if parts else "no sample"
        figure = float(growth_bytes) if (saved is not None or peak is not None) else 0.0
        return Measurement(cls.name, figure, cls.unit, display, cls.threshold, bool(findings), details=details,
                           findings=findings)


# --------------------------------------------------------------------------------------------------
# TGL201: module mode
# --------------------------------------------------------------------------------------------------


def _still_rising(values: list, back: int) -> bool:
    """Whether a figure sampled at increasing checkpoints ends above where it started and, given
    more than ``back`` samples, above the sample ``back`` places from the end (it still rises
    late: a figure that levels off after warm-up is not growth); ``None`` samples are unknown."""
    first, last = values[0], values[-1]
    if first is None or last is None or not last > first:
        return False
    return len(values) <= back or (values[-back] is not None and last > values[-back])


def _deliberate_codes() -> set:
    codes = set()
    try:
        from torch.optim.swa_utils import update_bn

        codes.add(getattr(update_bn, "__wrapped__", update_bn).__code__)
    except (ImportError, AttributeError):  # pragma: no cover
        pass
    return codes


#: dropout/batch-norm calls the module-mode probe holds, undecided, between two backwards (a training forward
#: of a large model makes a few hundred; an evaluation-only program makes them without end)
HELD_CALLS = 4096


def _frame_key(frames: list) -> Optional[tuple]:
    """``(id, code)`` of the first frame of ``frames`` (a frame running now), else ``None``."""
    return (id(frames[0]), frames[0].f_code) if frames else None


class ModuleModeProbe(Probe):
    """Dropout / batch-norm running in training mode while grad mode is off.

    Seen at the functional level (:mod:`.instrument` wraps ``F.dropout`` and variants,
    ``F.batch_norm`` and ``F.scaled_dot_product_attention``), so ``nn.Dropout``,
    ``nn.BatchNorm*``, ``nn.MultiheadAttention``'s attention dropout, a functional
    ``F.dropout(x, p, training=True)`` and SDPA with ``dropout_p > 0`` all count. A call
    counts when grad mode is off (no_grad / inference_mode) and dropout is active
    (``p > 0``, ``training=True``) or batch norm updates running statistics. Deliberate
    uses are not counted: inside ``torch.optim.swa_utils.update_bn``, when the
    outermost module being called is in eval mode (Monte-Carlo dropout: dropout
    switched on explicitly in an eval-mode model), and Monte-Carlo dropout by
    ``model.train()``: dropout (not batch norm) in a module the program put in
    training mode with an explicit ``train()``, run at one site on one input (same
    storage and shape) at least twice while that switch holds, with no backward
    while it holds (a ``train()`` at the top of an epoch that trains after an
    evaluation is no such switch). Those calls are decided when the sample is
    taken, once what followed the switch is known. Nor are the calls of a training
    forward run under no_grad by mistake: calls made from the frame (the same
    running function) whose next backward then fails with autograd's grad-mode error
    are TGL002's defect, which the grad-mode probe reports, not an evaluation.

    Attribution: the user's call stack of the module call. Figure: such calls (count)
    in the run at N. Threshold: defect when >= 1.
    """

    name = "module-mode"
    unit = "calls"
    threshold = (">= 1 dropout/batch-norm call in training mode while grad mode is off (not in update_bn, not in a "
                 "model in eval mode, not Monte-Carlo dropout sampling after an explicit train())")

    def __init__(self) -> None:
        super().__init__()
        self.sites: dict[str, dict] = {}
        self.deliberate = 0
        self._deliberate_codes = _deliberate_codes()
        # module -> its explicit ``train()`` switch in force: {"trained": a backward ran since}
        self._switches: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
        # (site, switch, input) -> dropout calls under an explicit switch, decided in sample()
        self._sampling: dict[tuple, dict] = {}
        self._last_args: Any = None  # the argument tuple of the latest such forward (a new tuple: a new forward)
        # calls counted since the last backward began, each with the user's frame that called the model:
        # a backward of that same frame that then fails for grad mode shows the forward was a training
        # forward run under no_grad by mistake (TGL002's defect, which the grad-mode probe reports)
        self._held: list[tuple] = []
        self._in_backward: list[tuple] = []  # (the backward's calling frame, calls held when it began)
        self.training_forward_calls = 0

    def _install(self, stack: ExitStack) -> None:
        """Wrap ``nn.Module.train`` (which ``eval()`` calls) to see the program's explicit
        switches: the module it is called on, not the children it recurses into."""
        original = torch.nn.Module.train
        probe = self
        depth = [0]

        def train(self: torch.nn.Module, mode: bool = True) -> torch.nn.Module:
            depth[0] += 1
            try:
                return original(self, mode)
            finally:
                depth[0] -= 1
                if not depth[0]:
                    probe._switched(self, bool(mode))

        torch.nn.Module.train = train  # type: ignore[method-assign]
        stack.callback(setattr, torch.nn.Module, "train", original)

    def _switched(self, module: Any, mode: bool) -> None:
        if mode:
            self._switches[module] = {"trained": False}
        else:
            self._switches.pop(module, None)

    def on_backward_begin(self, kind: str, roots: tuple, retain: bool, create_graph: bool) -> None:
        for switch in self._switches.values():
            switch["trained"] = True
        self._in_backward.append((_frame_key(instrument.user_frames(limit=1)), self._held))
        self._held = []

    def on_backward_end(self, kind: str, result: Any, create_graph: bool) -> None:
        if self._in_backward:
            for call in self._in_backward.pop()[1]:
                self._apply(call, self.sites, self._sampling)

    def on_backward_error(self, kind: str, exc: BaseException) -> None:
        if not self._in_backward:
            return
        frame, held = self._in_backward.pop()
        grad_mode = isinstance(exc, RuntimeError) and GRAD_MODE_ERRORS.search(str(exc)) is not None
        for call in held:
            if grad_mode and frame is not None and call[0] == frame:
                self.training_forward_calls += 1
            else:
                self._apply(call, self.sites, self._sampling)

    def on_mode_op(self, kind: str, details: dict) -> None:
        if instrument.code_on_stack(self._deliberate_codes) is not None:
            self.deliberate += 1
            return
        outer = instrument.outermost_module_call()
        if outer is not None and not outer[0].training:
            self.deliberate += 1
            return
        # attributed to the user's call of the outermost module (the model call under no_grad)
        user = outer[1].f_back if outer else None  # the frame that called the outermost module
        stack = [list(s) for s in instrument.user_stack(frame=user)]
        module = type(outer[0]).__name__ if outer else "functional"
        switch = self._switches.get(outer[0]) if outer is not None and kind != "batch_norm" else None
        group = None
        if switch is not None:
            args = outer[1].f_locals.get("args")  # type: ignore[union-attr]
            first = next((a for a in args or () if isinstance(a, torch.Tensor)), None)
            if first is not None:
                key = (repr(stack), id(switch), first.data_ptr(), tuple(first.shape))
                group = (key, {"stack": stack, "switch": switch, "modules": module}, args is not self._last_args)
                self._last_args = args
        self._held.append((_frame_key(instrument.user_frames(limit=1, frame=user)), stack, module, kind, details,
                           group))
        if len(self._held) > HELD_CALLS:  # a program that evaluates without ever calling backward: count the oldest
            for call in self._held[:HELD_CALLS // 2]:
                self._apply(call, self.sites, self._sampling)
            del self._held[:HELD_CALLS // 2]

    def _apply(self, call: tuple, sites: dict, sampling: dict) -> None:
        """Count a held call: into its Monte-Carlo sampling group (decided in :meth:`sample`) or its site."""
        _, stack, module, kind, details, group = call
        if group is None:
            self._count(stack, module, kind, details, sites=sites)
            return
        key, init, new_forward = group
        rec = sampling.get(key)
        if rec is None:
            rec = sampling[key] = {**init, "forwards": 0, "calls": 0}
        rec["forwards"] += int(new_forward)
        rec["calls"] += 1

    def _count(self, stack: list, module: str, kind: str, details: dict, calls: int = 1,
               sites: Optional[dict] = None) -> None:
        sites = self.sites if sites is None else sites
        rec = sites.setdefault(repr(stack), {"stack": stack, "calls": 0, "dropout_calls": 0, "norm_calls": 0,
                                             "running_stats_changed": 0, "modules": module})
        rec["calls"] += calls
        if kind == "batch_norm":
            rec["norm_calls"] += calls
            rec["running_stats_changed"] += int(details.get("running_stats_changed", False))
        else:
            rec["dropout_calls"] += calls

    def sample(self) -> dict:
        """Per call site: train-mode calls under no_grad by kind, batch-norm updates; deliberate calls.
        Dropout calls under an explicit ``train()`` are Monte-Carlo sampling (deliberate) when their
        group ran >= 2 forwards on one input and no backward ran while the switch held."""
        sites = {k: dict(v) for k, v in self.sites.items()}
        sampling = {k: dict(v) for k, v in self._sampling.items()}
        for call in [c for _, held in self._in_backward for c in held] + self._held:
            self._apply(call, sites, sampling)  # not followed by a failed backward of their frame (yet)
        deliberate = self.deliberate
        for group in sampling.values():
            if group["forwards"] >= 2 and not group["switch"]["trained"]:
                deliberate += group["calls"]
            else:
                self._count(group["stack"], group["modules"], "dropout", {}, group["calls"], sites)
        self._last_args = None
        listed = list(sites.values())
        keys = ("calls", "dropout_calls", "norm_calls", "running_stats_changed")
        total = {k: sum(s[k] for s in listed) for k in keys}
        return {**total, "sites": listed, "deliberate_calls": deliberate,
                "training_forward_calls": self.training_forward_calls}

    @classmethod
    def decide(cls, samples: dict[int, dict]) -> Measurement:
        """Defect iff a run has >= 1 counted call; one finding per call site."""
        s = samples[min(samples)]
        defect = any(v["calls"] >= 1 for v in samples.values())
        findings = []
        for site in s["sites"]:
            text = f"{site['calls']} call(s) of dropout/batch norm in training mode under no_grad"
            if site["norm_calls"]:
                text += f" (running stats changed in {site['running_stats_changed']})"
            findings.append(_finding("TGL201", site["stack"], float(site["calls"]), cls.unit, text))
        display = f"train-mode calls under no_grad: {s['calls']}"
        if s["norm_calls"]:
            display += f" (running stats changed in {s['running_stats_changed']})"
        if s.get("deliberate_calls"):
            display += f"; deliberate: {s['deliberate_calls']}"
        if s.get("training_forward_calls"):
            display += f"; in training forwards under no_grad (TGL002): {s['training_forward_calls']}"
        return Measurement(cls.name, float(s["calls"]), cls.unit, display, cls.threshold, defect,
                           findings=findings, details={"runs": {str(k): v for k, v in samples.items()}})


#: the core rules' probes (every probe: :func:`.probe_registry.all_probes`)
PROBES: dict[str, type[Probe]] = {p.name: p for p in
                                  (StaleGradientProbe, GradModeProbe, RetainedGraphProbe, ModuleModeProbe)}


def install_autograd_wrappers() -> None:
    """Install the process-wide wrappers (kept for callers of the earlier API; see :func:`.instrument.install`)."""
    instrument.install()
