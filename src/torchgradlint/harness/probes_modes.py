"""Probes for the rules about grad mode and module mode left switched.

=================  ===========  ==========================================================
probe              rules        defect when
=================  ===========  ==========================================================
grad-mode-leak     TGL005       >= 1 backward / autograd.grad call found grad mode off,
                                switched off by a call that outlived it: made in a
                                function that has returned, or on a later line of a loop
                                that has come round again
train-in-eval      TGL202       >= 1 training forward (a top-level module forward whose
                                graph a backward used) of a module with dropout or batch
                                norm ran with ``module.training`` False
=================  ===========  ==========================================================

Each probe observes the fixture from outside, like those of :mod:`.probes`:
the first patches ``torch.set_grad_enabled.__init__`` (which ``torch.no_grad``'s
``__enter__``/``__exit__`` call) to see where grad mode is switched off, the
second ``torch.nn.Module.train`` (which ``eval()`` calls) to see where a module
is put in eval mode; both restore the originals afterwards.
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from typing import Any, Optional

import torch

from . import instrument
from .probe_base import Measurement, Probe
from .probe_base import finding as _finding
from .module_calls import CALLS
from .probes import GRAD_MODE_ERRORS
from .probes_structure import _tensors

# --------------------------------------------------------------------------------------------------
# TGL005: grad mode left off
# --------------------------------------------------------------------------------------------------


def _user_frame(frame: Any) -> Any:
    """The innermost frame of the user's program at or above ``frame``."""
    while frame is not None and not instrument.is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


class GradModeLeakProbe(Probe):
    """Backward calls that find grad mode still off from a switch that outlived its place.

    ``torch.set_grad_enabled(mode)`` sets grad mode in its constructor, and
    ``torch.no_grad().__enter__()``/``__exit__()`` go through it, so a wrapper
    around ``torch.set_grad_enabled.__init__`` sees every switch made through the
    Python API with the user's frame that made it. At each backward /
    ``torch.autograd.grad`` call (:mod:`.instrument` listeners) with grad mode off,
    the switch still in force is *leaked* when the user's function that made it
    has returned (an evaluation helper with a bare ``set_grad_enabled(False)``) or
    is now running an earlier line than the switch (a loop came round: the switch
    was made late in the previous iteration). A ``with torch.no_grad():`` block
    around a backward is neither (its frame is running, after the ``with`` line).
    A grad-mode ``RuntimeError`` raised by such a backward ("element 0 of tensors
    does not require grad") is claimed as the measured defect.

    Attribution: the user's call stack of the switch (innermost first).
    Figure: backward calls that found a leaked switch (count) in the run at N.
    Threshold: defect when >= 1 (a training backward needs grad mode on for the
    forward it differentiates; a switch that outlives its function or loop
    iteration is never meant).

    The probe restores the grad mode it found when the run ends (a leaked switch
    would otherwise carry over into the next run of the same process).
    """

    name = "grad-mode-leak"
    unit = "backwards"
    threshold = (">= 1 backward/autograd.grad call found grad mode off, switched off by a call made in a function "
                 "that has returned or later in a loop iteration that has ended")

    def __init__(self) -> None:
        super().__init__()
        self.backwards = 0
        self.leaked = 0
        self.errors: list[str] = []
        self.sites: dict[str, dict] = {}
        self._site: Optional[tuple[Any, int, list]] = None  # (frame, line, stack) of the switch in force
        self._current_leak: Optional[dict] = None
        self._claimed: set[int] = set()

    # switches --------------------------------------------------------------------------------
    def _switched(self, mode: bool, was: bool) -> None:
        if mode:
            self._site = None
            return
        if not was:  # already off (a ``no_grad`` exit restoring off): the switch in force stays the one
            return
        frame = sys._getframe(2)
        while frame is not None and not instrument.is_user_file(frame.f_code.co_filename):
            if instrument.is_probe_frame(frame):  # a probe's own no_grad, not the program's
                return
            frame = frame.f_back
        if frame is None:
            return
        self._site = (frame, frame.f_lineno, [list(s) for s in instrument.user_stack(frame=frame)])

    def _install(self, stack: ExitStack) -> None:
        cls = torch.set_grad_enabled
        original = cls.__init__
        probe = self

        def __init__(self: Any, mode: bool) -> None:
            was = torch.is_grad_enabled()
            original(self, mode)
            probe._switched(bool(mode), was)

        previous = torch.is_grad_enabled()
        stack.callback(torch._C._set_grad_enabled, previous)
        cls.__init__ = __init__  # type: ignore[method-assign]
        stack.callback(setattr, cls, "__init__", original)

    # backward calls ----------------------------------------------------------------------------
    def _leak(self) -> Optional[list]:
        """The stack of the switch in force when it has outlived its place, else ``None``."""
        if torch.is_grad_enabled() or self._site is None:
            return None
        frame, line, site_stack = self._site
        f = sys._getframe(1)
        while f is not None:
            if f is frame:
                return site_stack if f.f_lineno < line else None
            f = f.f_back
        return site_stack  # the function that switched grad mode off has returned

    def on_backward_begin(self, kind: str, roots: tuple, retain: bool, create_graph: bool) -> None:
        self.backwards += 1
        stack = self._leak()
        self._current_leak = None
        if stack is None:
            return
        self.leaked += 1
        rec = self.sites.setdefault(repr(stack), {"stack": stack, "backwards": 0, "errors": 0})
        rec["backwards"] += 1
        self._current_leak = rec

    def on_backward_end(self, kind: str, result: Any, create_graph: bool) -> None:
        self._current_leak = None

    def on_backward_error(self, kind: str, exc: BaseException) -> None:
        if self._current_leak is not None and isinstance(exc, RuntimeError) and GRAD_MODE_ERRORS.search(str(exc)):
            self._current_leak["errors"] += 1
            self.errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
            self._claimed.add(id(exc))
        self._current_leak = None

    def on_exception(self, exc: BaseException) -> bool:
        return id(exc) in self._claimed

    def sample(self) -> dict:
        """Backward calls, those that found a leaked switch, grad-mode errors they raised, per switch site."""
        return {"backwards": self.backwards, "leaked": self.leaked, "errors": list(self.errors),
                "sites": list(self.sites.values())}

    @classmethod
    def decide(cls, samples: dict[int, dict]) -> Measurement:
        """Defect iff a run has >= 1 backward call that found a leaked switch; one finding per switch site."""
        s = samples[min(samples)]
        defect = any(v["leaked"] >= 1 for v in samples.values())
        findings = []
        for site in s["sites"]:
            text = f"{site['backwards']} backward call(s) found grad mode left off here"
            if site["errors"]:
                text += f" ({site['errors']} raised)"
            findings.append(_finding("TGL005", site["stack"], float(site["backwards"]), cls.unit, text))
        display = f"backwards with grad mode left off: {s['leaked']}/{s['backwards']}"
        if s["errors"]:
            display += f" ({len(s['errors'])} raised: {s['errors'][0][:80]})"
        return Measurement(cls.name, float(s["leaked"]), cls.unit, display, cls.threshold, defect,
                           findings=findings, details={"runs": {str(k): v for k, v in samples.items()}})


# --------------------------------------------------------------------------------------------------
# TGL202: training forwards in eval mode
# --------------------------------------------------------------------------------------------------


def _mode_layers(module: torch.nn.Module) -> tuple[bool, list]:
    """``(has a mode-dependent layer, batch-norm layers that track running statistics)``."""
    nn = torch.nn
    norms = [m for m in module.modules()
             if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    dropout = any((isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0)
                  or (isinstance(m, nn.MultiheadAttention) and m.dropout > 0) for m in module.modules())
    return dropout or bool(norms), norms


def _tracked(norms: list) -> int:
    return sum(int(m.num_batches_tracked) for m in norms if m.num_batches_tracked is not None)


class TrainInEvalProbe(Probe):
    """Training forwards that ran in eval mode (a mode census).

    The shared global forward pre-hook/hook pair (:mod:`.module_calls`) shows it every
    top-level module call (one not nested in another module's forward) of a module with dropout (``p > 0``) or
    batch norm that tracks running statistics. When grad mode is on and the output
    has a ``grad_fn``, a tensor hook on it marks the forward as a *training*
    forward once a backward propagates through it. For each such forward the probe
    notes ``module.training`` and whether the batch-norm running statistics were
    updated (``num_batches_tracked`` grew). A wrapper around
    ``torch.nn.Module.train`` (which ``eval()`` calls) records the user's call
    stack of each module's latest switch to eval mode.

    Figure: the fraction of training forwards that ran in eval mode (dropout off,
    batch norm on frozen statistics), over every mode-dependent module, in the run
    at N. Threshold: defect when >= 1 training forward ran in eval mode (a training
    step's forward runs in training mode; freezing batch norm on purpose is done
    per layer, not by training a model in eval mode).

    Attribution: the stack of the module's latest ``eval()`` before its first
    training forward in eval mode.
    """

    name = "train-in-eval"
    unit = "fraction"
    threshold = ">= 1 training forward (output backpropagated) of a module with dropout/batch norm in eval mode"

    def __init__(self) -> None:
        super().__init__()
        self.records: list[dict] = []
        self._layers: dict[int, tuple[bool, list]] = {}
        self._pending: dict[int, int] = {}
        self._eval_sites: dict[int, list] = {}
        self.sites: dict[str, dict] = {}

    def _layers_of(self, module: torch.nn.Module) -> tuple[bool, list]:
        key = id(module)
        if key not in self._layers:
            self._layers[key] = _mode_layers(module)
        return self._layers[key]

    def _before(self, module: torch.nn.Module) -> None:
        sensitive, norms = self._layers_of(module)
        if sensitive:
            self._pending[id(module)] = _tracked(norms)

    def _on_call(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        before = self._pending.pop(id(module), None)
        if before is None or not torch.is_grad_enabled():
            return
        outs = [t for t in _tensors(output) if t.grad_fn is not None]
        if not outs:
            return
        _, norms = self._layers_of(module)
        rec = {"module": type(module).__name__, "training": bool(module.training),
               "bn_updated": _tracked(norms) > before if norms else None, "trained": False,
               "eval_site": None if module.training else self._eval_sites.get(id(module), [])}
        self.records.append(rec)

        def hook(grad: torch.Tensor) -> None:
            rec["trained"] = True

        for t in outs:
            t.register_hook(hook)

    def _install(self, stack: ExitStack) -> None:
        original = torch.nn.Module.train
        probe = self

        def train(self: torch.nn.Module, mode: bool = True) -> torch.nn.Module:
            if mode:
                probe._eval_sites.pop(id(self), None)
            else:
                probe._eval_sites[id(self)] = [list(s) for s in instrument.user_stack()]
            return original(self, mode)

        torch.nn.Module.train = train  # type: ignore[method-assign]
        stack.callback(setattr, torch.nn.Module, "train", original)
        CALLS.subscribe(stack, top_pre=self._before, top_post=self._on_call)

    def sample(self) -> dict:
        """Training forwards, those in eval mode, batch-norm updates, and the eval sites."""
        trained = [r for r in self.records if r["trained"]]
        in_eval = [r for r in trained if not r["training"]]
        sites: dict[str, dict] = {}
        for r in in_eval:
            key = repr(r["eval_site"])
            site = sites.setdefault(key, {"stack": r["eval_site"], "forwards": 0, "module": r["module"]})
            site["forwards"] += 1
        with_bn = [r for r in trained if r["bn_updated"] is not None]
        return {"training_forwards": len(trained), "eval_mode": len(in_eval),
                "bn_forwards": len(with_bn), "bn_updated": sum(1 for r in with_bn if r["bn_updated"]),
                "sites": list(sites.values())}

    @classmethod
    def decide(cls, samples: dict[int, dict]) -> Measurement:
        """Defect iff a run has >= 1 training forward in eval mode; one finding per eval site."""
        s = samples[min(samples)]
        defect = any(v["eval_mode"] >= 1 for v in samples.values())
        total = s["training_forwards"]
        fraction = s["eval_mode"] / total if total else 0.0
        findings = [_finding("TGL202", site["stack"], float(site["forwards"]), "forwards",
                             f"{site['forwards']} training forward(s) of {site['module']} in eval mode after this "
                             "eval()") for site in s["sites"]]
        display = f"training forwards in eval mode: {s['eval_mode']}/{total} ({fraction:.0%})"
        if s["bn_forwards"]:
            display += f"; batch norm updated in {s['bn_updated']}/{s['bn_forwards']}"
        return Measurement(cls.name, round(fraction, 4), cls.unit, display, cls.threshold, defect,
                           findings=findings, details={"runs": {str(k): v for k, v in samples.items()}})


MODE_PROBES: dict[str, type[Probe]] = {p.name: p for p in (GradModeLeakProbe, TrainInEvalProbe)}
