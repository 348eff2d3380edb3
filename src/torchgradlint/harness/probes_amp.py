"""Probes for the mixed-precision rules (TGL301, TGL302): what a ``GradScaler``'s scale does to
clipping and to optimizer steps (imports torch).

=================  ===========  ==========================================================
probe              rules        defect when
=================  ===========  ==========================================================
amp-clip-scale     TGL301       >= 1 gradient clip that clipped and whose cap, in the units
                                of the gradients the optimizer step then applied, differs
                                from its threshold by a factor >= 2 (it clipped gradients
                                still multiplied by a loss scale its threshold did not carry)
amp-scaler-bypass  TGL302       >= 1 plain ``optimizer.step()`` that applied gradients still
                                multiplied by a loss scale > 1, or applied non-finite
                                gradients after ``unscale_`` (the check ``scaler.step``
                                does), or the scaler raised its misuse error (``step()``
                                twice without ``update()``; ``update()`` with no inf check)
=================  ===========  ==========================================================

Both probes only read tensors: hooks return ``None``, wrapped ``GradScaler`` and clipping
functions return what the originals return. One exception by design: ``GradScaler.get_scale``
returns a :class:`ScaleUnits` (a ``float`` subclass with the same value) so that a clipping
threshold computed as ``max_norm * scaler.get_scale()`` is known to be in scaled units.
"""

from __future__ import annotations

import math
import traceback
import weakref
from contextlib import ExitStack
from typing import Any, Callable, Optional

import torch

from . import instrument
from .probe_base import Measurement, Probe, grad_mark, unchanged
from .probe_base import finding as _finding

#: a clip's cap, in the units of the applied gradients, may differ from its threshold by less than this factor
CAP_FACTOR = 2.0


class ScaleUnits(float):
    """A ``float`` equal to a ``GradScaler``'s scale, and products with it, that remembers the scale:
    ``max_norm * scaler.get_scale()`` is a threshold in scaled units (``scale`` is the factor)."""

    scale: float = 1.0

    @classmethod
    def of(cls, value: float, scale: float) -> "ScaleUnits":
        """``value`` tagged as carrying ``scale``."""
        out = cls(value)
        out.scale = scale
        return out

    def __mul__(self, other: Any) -> Any:
        value = float.__mul__(self, other)
        return ScaleUnits.of(value, self.scale) if isinstance(other, (int, float)) else value

    __rmul__ = __mul__


def _patch(stack: ExitStack, owner: Any, name: str, make: Callable[[Callable], Callable]) -> None:
    """Replace ``owner.name`` with ``make(original)``; restore it when ``stack`` closes."""
    orig = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    wrapped = make(orig)
    try:
        wrapped.__wrapped__ = orig  # type: ignore[attr-defined]
    except AttributeError:  # pragma: no cover - builtins
        pass
    setattr(owner, name, wrapped)
    stack.callback(setattr, owner, name, orig)


def _tensors(parameters: Any) -> list[torch.Tensor]:
    if isinstance(parameters, torch.Tensor):
        return [parameters]
    return [p for p in parameters if isinstance(p, torch.Tensor)]


def _optimizer_params(optimizer: Any) -> list[torch.Tensor]:
    return [p for g in optimizer.param_groups for p in g["params"] if isinstance(p, torch.Tensor)]


def _traceback_stack(exc: BaseException) -> list:
    """The user's frames of an exception's traceback, innermost first."""
    frames = traceback.extract_tb(exc.__traceback__)
    return [[f.filename, f.lineno] for f in reversed(frames) if instrument.is_user_file(f.filename)][:6]


def _grad_scaler_class() -> type:
    from torch.amp.grad_scaler import GradScaler

    return GradScaler


def _tag_scale(orig: Callable) -> Callable:
    """``GradScaler.get_scale`` returning :class:`ScaleUnits` when the scaler is enabled."""
    def get_scale(scaler: Any) -> Any:
        value = orig(scaler)
        return ScaleUnits.of(value, value) if scaler.is_enabled() else value

    return get_scale


# --------------------------------------------------------------------------------------------------
# TGL301: clipping scaled gradients
# --------------------------------------------------------------------------------------------------


class AmpClipScaleProbe(Probe):
    """Measures, for every gradient clip, the cap it put on the gradients the optimizer then applied.

    The probe wraps ``torch.nn.utils.clip_grad._clip_grads_with_norm_`` (what every spelling of
    ``clip_grad_norm_`` calls through its module) and ``clip_grad_value_`` (module attributes),
    and records per clipped parameter its gradient's norm (max-abs for value clipping) right after
    the clip. At the next optimizer step (global step pre-hook: inside ``scaler.step`` this runs
    after the scaler unscaled) it measures the same gradients again; their ratio ``k`` is the
    scale factor the clip saw (65536 when it ran before ``unscale_``, 1 after). A clip that clipped
    capped the applied gradients at ``threshold / k``; the intended cap is the threshold, or
    ``threshold / scale`` when the threshold was computed from ``scaler.get_scale()``
    (:class:`ScaleUnits`). The figure is applied cap / intended cap (1.0 when correct).

    Figure: the ratio farthest from 1 over the clips of the run at N (dimensionless).
    Threshold: defect when a clip that clipped has a ratio <= 1/2 or >= 2.
    """

    name = "amp-clip-scale"
    unit = "x threshold"
    threshold = (f"a clip that clipped capped the applied gradients at <= 1/{CAP_FACTOR:g} or >= {CAP_FACTOR:g} "
                 "times its threshold (applied gradient norm vs max_norm)")

    def __init__(self) -> None:
        super().__init__()
        self.clips = 0
        self.clipped = 0
        self.measured = 0
        self.scaled = False  # an enabled GradScaler scaled a loss in this run
        self.sites: dict[str, dict] = {}
        self._pending: list[dict] = []

    def _install(self, stack: ExitStack) -> None:
        import torch.nn.utils as nn_utils
        import torch.nn.utils.clip_grad as clip_grad
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        scaler_cls = _grad_scaler_class()
        _patch(stack, scaler_cls, "get_scale", _tag_scale)
        _patch(stack, scaler_cls, "scale", self._wrap_scale)
        _patch(stack, clip_grad, "_clip_grads_with_norm_", self._wrap_norm)
        value = self._wrap_value(clip_grad.clip_grad_value_)
        for owner in (clip_grad, nn_utils):
            orig = getattr(owner, "clip_grad_value_")
            setattr(owner, "clip_grad_value_", value)
            stack.callback(setattr, owner, "clip_grad_value_", orig)
        stack.callback(register_optimizer_step_pre_hook(self._pre_step).remove)

    def _wrap_scale(self, orig: Callable) -> Callable:
        def scale(scaler: Any, outputs: Any) -> Any:
            if scaler.is_enabled():
                self.scaled = True
            return orig(scaler, outputs)

        return scale

    def _wrap_norm(self, orig: Callable) -> Callable:
        def clip(parameters: Any, max_norm: Any, total_norm: Any, foreach: Any = None) -> Any:
            params = _tensors(parameters)
            total = float(total_norm)
            result = orig(params, max_norm, total_norm, foreach)
            self._record("norm", params, max_norm, total, lambda g: float(g.double().pow(2).sum()))
            return result

        return clip

    def _wrap_value(self, orig: Callable) -> Callable:
        def clip_grad_value_(parameters: Any, clip_value: Any, foreach: Any = None) -> Any:
            params = _tensors(parameters)
            grads = [p.grad for p in params if p.grad is not None]
            before = max((float(g.abs().max()) for g in grads if g.numel()), default=0.0)
            result = orig(params, clip_value, foreach)
            self._record("value", params, clip_value, before, lambda g: float(g.abs().max()) if g.numel() else 0.0)
            return result

        clip_grad_value_.__wrapped__ = orig  # type: ignore[attr-defined]
        return clip_grad_value_

    def _record(self, kind: str, params: list, threshold: Any, before: float, measure: Callable) -> None:
        if not self.scaled:  # no GradScaler has scaled a loss: no scale factor for a clip to miss
            return
        self.clips += 1
        ids = {id(p) for p in params}
        self._pending = [r for r in self._pending if not (r["after"].keys() & ids)]  # superseded
        limit = float(threshold)
        if not math.isfinite(before) or not math.isfinite(limit) or before <= limit:
            return  # nothing clipped (or nothing measurable)
        self.clipped += 1
        carried = threshold.scale if isinstance(threshold, ScaleUnits) else 1.0
        with torch.no_grad():
            after = {id(p): (weakref.ref(p), measure(p.grad)) for p in params if p.grad is not None}
        self._pending.append({"kind": kind, "after": after, "threshold": limit, "carried": carried,
                              "stack": [list(s) for s in instrument.user_stack()], "measure": measure})

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        owned = {id(p) for p in _optimizer_params(optimizer)}
        keep = []
        for rec in self._pending:
            shared = [pid for pid in rec["after"] if pid in owned]
            if not shared:
                keep.append(rec)
                continue
            self._resolve(rec, shared)
        self._pending = keep

    def _resolve(self, rec: dict, shared: list[int]) -> None:
        now, then = [], []
        with torch.no_grad():
            for pid in shared:
                ref, value = rec["after"][pid]
                p = ref()
                if p is None or p.grad is None:
                    continue
                now.append(rec["measure"](p.grad))
                then.append(value)
        if rec["kind"] == "norm":
            applied, clipped = math.sqrt(sum(now)), math.sqrt(sum(then))
        else:
            applied, clipped = max(now, default=0.0), max(then, default=0.0)
        if not (applied > 0 and clipped > 0 and math.isfinite(applied) and math.isfinite(clipped)):
            return
        self.measured += 1
        factor = clipped / applied  # the scale factor the clip saw, relative to the applied gradients
        ratio = rec["carried"] / factor  # applied cap / intended cap
        key = ":".join(str(x) for x in (rec["stack"][0] if rec["stack"] else ["?", 0]))
        site = self.sites.setdefault(key, {"stack": rec["stack"], "kind": rec["kind"], "measured": 0, "bad": 0,
                                           "ratio": 1.0, "factor": 1.0, "threshold": rec["threshold"],
                                           "applied": None, "carried": rec["carried"]})
        site["measured"] += 1
        if abs(math.log(ratio)) > abs(math.log(site["ratio"])) or site["applied"] is None:
            site.update(ratio=ratio, factor=factor, applied=applied)
        if ratio <= 1 / CAP_FACTOR or ratio >= CAP_FACTOR:
            site["bad"] += 1

    def sample(self) -> dict:
        """``clips``, ``clipped`` ones, ``measured`` at a later step, and per clip site: its stack, kind
        (norm/value), measured and bad clips, the ratio farthest from 1, the scale factor seen, the
        applied norm (or max-abs) at that step and the threshold."""
        return {"clips": self.clips, "clipped": self.clipped, "measured": self.measured,
                "sites": [dict(s) for s in self.sites.values()]}

    @classmethod
    def decide(cls, samples: dict[int, dict]) -> Measurement:
        """Defect iff a run has a clip site with >= 1 bad clip; one finding per bad site."""
        s = samples[min(samples)]
        defect = any(site["bad"] >= 1 for v in samples.values() for site in v["sites"])
        findings = []
        worst = None
        for site in s["sites"]:
            if worst is None or abs(math.log(site["ratio"])) > abs(math.log(worst["ratio"])):
                worst = site
            if site["bad"]:
                findings.append(_finding("TGL301", site["stack"], site["ratio"], cls.unit, cls._describe(site)))
        if worst is None:
            display = f"clips: {s['clips']}, clipped: {s['clipped']}, none measured at a later step"
            figure = 1.0
        else:
            display = cls._describe(worst) + f" ({s['clipped']}/{s['clips']} clips clipped)"
            figure = worst["ratio"]
        return Measurement(cls.name, figure, cls.unit, display, cls.threshold, defect, findings=findings,
                           details={"runs": {str(k): v for k, v in samples.items()}})

    @staticmethod
    def _describe(site: dict) -> str:
        what = "gradient norm" if site["kind"] == "norm" else "max |gradient|"
        intended = site["threshold"] / site["carried"]
        return (f"applied {what} {site['applied']:.3g} vs threshold {intended:.3g} (x{site['ratio']:.3g}); "
                f"scale factor at the clip {site['factor']:.6g}")


# --------------------------------------------------------------------------------------------------
# TGL302: a GradScaler bypassed
# --------------------------------------------------------------------------------------------------

_MISUSE = ("step() has already been called since the last update()", "No inf checks were recorded")


def _leaves(roots: tuple) -> list[torch.Tensor]:
    """Leaf tensors (``AccumulateGrad`` variables) a backward from ``roots`` reaches."""
    out: list[torch.Tensor] = []
    seen: set[int] = set()
    todo = [t.grad_fn for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    while todo:
        fn = todo.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        var = getattr(fn, "variable", None)
        if isinstance(var, torch.Tensor):
            out.append(var)
        todo.extend(nxt for nxt, _ in fn.next_functions)
    return out


class AmpScalerBypassProbe(Probe):
    """Measures optimizer steps that bypass a ``GradScaler``.

    ``GradScaler.scale`` is wrapped to remember its outputs (when the scaler is enabled) and the
    scale; a backward from such an output (an autograd listener) marks every parameter it reaches
    as holding gradients multiplied by that scale. ``GradScaler.unscale_`` clears the mark for the
    optimizer's parameters (``scaler.step`` calls it). A global optimizer step pre-hook then sees
    each ``step()``: one outside ``scaler.step`` whose parameters still hold marked gradients
    applies them multiplied by the scale; one outside ``scaler.step`` after ``unscale_`` with a
    non-finite gradient applies the inf/NaN that ``scaler.step`` would have skipped. The scaler's
    own misuse errors (``step()`` twice without ``update()``, ``update()`` with no inf check
    recorded) are claimed as the measured defect.

    Figure: bypassing steps plus misuse errors (count) in the run at N.
    Threshold: defect when >= 1.
    """

    name = "amp-scaler-bypass"
    unit = "steps"
    threshold = (">= 1 plain optimizer.step() that applied gradients still multiplied by a loss scale > 1, or "
                 "non-finite gradients after unscale_, or a GradScaler misuse error")

    def __init__(self) -> None:
        super().__init__()
        self.steps_total = 0
        self.scaler_steps = 0
        self.scaled_steps = 0
        self.nonfinite_steps = 0
        self.max_factor = 1.0
        self.errors: list[dict] = []
        self.sites: dict[str, dict] = {}
        self._outputs: dict[int, tuple[weakref.ref, float]] = {}
        self._backward_scale: Optional[tuple[list, float]] = None
        self._marked: dict[int, tuple[float, Optional[tuple]]] = {}
        self._unscaled: set[int] = set()
        self._inside_step = 0
        self._last_stack: list = []

    def _install(self, stack: ExitStack) -> None:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        cls = _grad_scaler_class()
        _patch(stack, cls, "scale", self._wrap_scale)
        _patch(stack, cls, "unscale_", self._wrap_unscale)
        _patch(stack, cls, "step", self._wrap_step)
        _patch(stack, cls, "update", self._wrap_update)
        stack.callback(register_optimizer_step_pre_hook(self._pre_step).remove)

    # GradScaler wrappers ---------------------------------------------------------------------------
    def _wrap_scale(self, orig: Callable) -> Callable:
        def scale(scaler: Any, outputs: Any) -> Any:
            result = orig(scaler, outputs)
            if scaler.is_enabled():
                factor = float(scaler._scale) if scaler._scale is not None else 1.0
                for t in (result if isinstance(result, (list, tuple)) else [result]):
                    if isinstance(t, torch.Tensor):
                        self._outputs[id(t)] = (weakref.ref(t), factor)
            return result

        return scale

    def _wrap_unscale(self, orig: Callable) -> Callable:
        def unscale_(scaler: Any, optimizer: Any) -> Any:
            result = orig(scaler, optimizer)
            for p in _optimizer_params(optimizer):
                self._marked.pop(id(p), None)
            self._unscaled.add(id(optimizer))
            return result

        return unscale_

    def _wrap_step(self, orig: Callable) -> Callable:
        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            self._inside_step += 1
            try:
                return orig(scaler, optimizer, *args, **kwargs)
            finally:
                self._inside_step -= 1
                self.scaler_steps += 1
                self._unscaled.discard(id(optimizer))

        return step

    def _wrap_update(self, orig: Callable) -> Callable:
        def update(scaler: Any, *args: Any, **kwargs: Any) -> Any:
            result = orig(scaler, *args, **kwargs)
            self._unscaled.clear()
            return result

        return update

    # autograd listener -----------------------------------------------------------------------------
    def on_backward_begin(self, kind: str, roots: tuple, retain: bool, create_graph: bool) -> None:
        """A backward from a scaled output marks the parameters it reaches (at its end)."""
        self._backward_scale = None
        if kind != "backward":
            return
        for t in roots:
            entry = self._outputs.get(id(t)) if isinstance(t, torch.Tensor) else None
            if entry is not None and entry[0]() is t and entry[1] > 1:
                self._backward_scale = (_leaves(roots), entry[1])
                return

    def on_backward_end(self, kind: str, result: Any, create_graph: bool) -> None:
        """Record the gradient state each reached parameter now holds, with its scale."""
        if self._backward_scale is None:
            return
        leaves, factor = self._backward_scale
        self._backward_scale = None
        for p in leaves:
            if p.grad is not None:
                self._marked[id(p)] = (factor, grad_mark(p.grad))

    # optimizer steps -------------------------------------------------------------------------------
    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.steps_total += 1
        if self._inside_step:
            return
        params = _optimizer_params(optimizer)
        factor = max((m[0] for p in params if (m := self._marked.get(id(p))) and unchanged(p.grad, m[1])),
                     default=None)
        if factor is not None:
            self.scaled_steps += 1
            self.max_factor = max(self.max_factor, factor)
            self._site("scaled", f"gradients x{factor:g} applied")
            return
        if id(optimizer) in self._unscaled:
            with torch.no_grad():
                bad = any(p.grad is not None and not bool(torch.isfinite(p.grad).all()) for p in params)
            if bad:
                self.nonfinite_steps += 1
                self._site("nonfinite", "non-finite gradients applied after unscale_")

    def _site(self, kind: str, text: str) -> None:
        stack = [list(s) for s in instrument.user_stack()]
        self._last_stack = stack
        key = ":".join(str(x) for x in (stack[0] if stack else ["?", 0])) + ":" + kind
        site = self.sites.setdefault(key, {"stack": stack, "kind": kind, "text": text, "steps": 0})
        site["steps"] += 1

    def on_exception(self, exc: BaseException) -> bool:
        """The scaler's misuse errors are this probe's measured defect."""
        text = str(exc)
        if not isinstance(exc, (RuntimeError, AssertionError)) or not any(m in text for m in _MISUSE):
            return False
        stack = _traceback_stack(exc)
        if "No inf checks" in text and self._last_stack:
            stack = self._last_stack  # raised in update(); caused by the plain step before it
        self.errors.append({"error": f"{type(exc).__name__}: {text}"[:200], "stack": stack})
        return True

    def sample(self) -> dict:
        """Step counts (all, through ``scaler.step``, scaled, non-finite), the largest scale factor
        applied, misuse ``errors`` with stacks, and per bypassing step site its stack and count."""
        return {"steps_total": self.steps_total, "scaler_steps": self.scaler_steps, "scaled_steps": self.scaled_steps,
                "nonfinite_steps": self.nonfinite_steps, "max_factor": self.max_factor, "errors": list(self.errors),
                "sites": [dict(s) for s in self.sites.values()]}

    @classmethod
    def decide(cls, samples: dict[int, dict]) -> Measurement:
        """Defect iff a run has >= 1 bypassing step or misuse error; one finding per site and error."""
        s = samples[min(samples)]

        def bad(v: dict) -> int:
            return v["scaled_steps"] + v["nonfinite_steps"] + len(v["errors"])

        defect = any(bad(v) >= 1 for v in samples.values())
        findings = [_finding("TGL302", site["stack"], float(site["steps"]), cls.unit,
                             f"{site['steps']} step(s): {site['text']}") for site in s["sites"]]
        findings += [_finding("TGL302", e["stack"], 1.0, cls.unit, e["error"]) for e in s["errors"]]
        display = (f"bypassing steps: {s['scaled_steps'] + s['nonfinite_steps']}/{s['steps_total']} "
                   f"(scaled gradients applied: {s['scaled_steps']}, max factor {s['max_factor']:g}; "
                   f"non-finite after unscale_: {s['nonfinite_steps']})")
        if s["errors"]:
            display += f"; raised {s['errors'][0]['error']}"
        return Measurement(cls.name, float(bad(s)), cls.unit, display, cls.threshold, defect, findings=findings,
                           details={"runs": {str(k): v for k, v in samples.items()}})


AMP_PROBES: dict[str, type[Probe]] = {p.name: p for p in (AmpClipScaleProbe, AmpScalerBypassProbe)}
