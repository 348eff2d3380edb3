"""Probes for the rules about the order of a training step (TGL003, TGL004).

===================  ===========  ==========================================================
probe                rules        defect when
===================  ===========  ==========================================================
discarded-gradients  TGL003       >= 1 backward whose finite, non-zero gradient on a
                                  parameter that an optimizer steps was reset (``None`` or
                                  zero) before any optimizer step used it
clip-effect          TGL004       >= 1 optimizer step whose gradients exceed the cap of a
                                  clip the program made on them (norm > max_norm, or
                                  max |g| > clip_value) by more than 0.1 %
===================  ===========  ==========================================================

Both observe the program from outside, like those of :mod:`.probes`: global
module forward pre-hooks and per-parameter gradient hooks, global optimizer
step hooks, and, while a run is observed, wrappers around
``torch.optim.Optimizer.zero_grad`` / ``torch.nn.Module.zero_grad`` and the
clipping functions of ``torch.nn.utils.clip_grad`` (restored afterwards).
"""

from __future__ import annotations

import math
import sys
import weakref
from contextlib import ExitStack
from typing import Any, Callable, Iterable, Optional

import torch

from . import instrument
from .module_calls import CALLS
from .probe_base import Measurement, Probe, own_parameters
from .probe_base import finding as _finding

#: relative slack over a clip's cap before a step counts as unclipped: ``clip_grad_norm_`` scales by
#: ``max_norm / (total_norm + 1e-6)``, so a clipped gradient sits at or just below the cap
CAP_SLACK = 1e-3


def _patch(stack: ExitStack, owner: Any, name: str, make: Callable[[Callable], Callable]) -> None:
    """Replace ``owner.name`` by ``make(original)`` until ``stack`` closes."""
    original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    setattr(owner, name, make(original))
    stack.callback(setattr, owner, name, original)


def _params(obj: Any) -> Iterable[torch.Tensor]:
    """The parameters of an optimizer (every group) or a module."""
    if isinstance(obj, torch.optim.Optimizer):
        for group in obj.param_groups:
            yield from (p for p in group["params"] if isinstance(p, torch.Tensor))
    elif isinstance(obj, torch.nn.Module):
        yield from obj.parameters()


# --------------------------------------------------------------------------------------------------
# TGL003: gradients reset before a step used them
# --------------------------------------------------------------------------------------------------


class DiscardedGradientProbe(Probe):
    """Backward passes whose gradients were reset before an optimizer step used them.

    * every parameter of a module that runs a forward (global forward pre-hook)
      or that an optimizer steps gets a post-accumulate-grad hook: after each
      backward (counted through :mod:`.instrument`) adds into its ``.grad``, the
      backward joins the parameter's *pending* set when the result is finite and
      not all zero (a non-finite gradient is one a skip guard rightly throws away);
      a backward run inside an optimizer's ``step()`` (an L-BFGS closure) is used
      by that step, never pending;
    * the pending set is *consumed* by an optimizer step (global step post-hook)
      over that parameter: its backwards are *used*;
    * it is *discarded* when the gradient is reset while pending: inside
      ``Optimizer.zero_grad`` / ``Module.zero_grad`` (wrapped while observed), or
      by an assignment to ``p.grad`` of an ``nn.Parameter`` (a ``grad`` property on
      ``nn.Parameter`` while observed, delegating to the tensor's own), each with
      the stack of that call or assignment; a reset in place (``p.grad.zero_()``)
      or on a plain tensor is found before the parameter's next backward adds into
      it (a tensor hook; the stack of that backward) or, set to ``None``, at the
      next step (no stack). An all-zero gradient found at a step is not a reset:
      a clip whose norm overflowed scales gradients by 0 in place (that step used
      them).

    A backward counts as discarded when a reset dropped its gradients on a
    parameter some optimizer steps and no optimizer step used any of its
    gradients: a GAN's generator backward also fills the discriminator's
    gradients, which the discriminator's reset rightly drops.
    Figure: discarded backwards out of all accumulating backwards in the run at N.
    Threshold: defect when >= 1.
    """

    name = "discarded-gradients"
    unit = "backwards"
    threshold = (">= 1 backward whose finite, non-zero gradients on stepped parameters were reset before any "
                 "optimizer step used any of them")

    def __init__(self) -> None:
        super().__init__()
        self.backwards = 0
        self.optimizer_steps = 0
        self._pending: dict[int, set[int]] = {}
        self._hooked: dict[int, list] = {}
        self._stepped: set[int] = set()
        self._stepping: dict[int, int] = {}  # parameter id -> optimizer steps in progress over it
        self._used: set[int] = set()  # backwards some step used
        self._discards: list[tuple[int, int, tuple]] = []  # (param id, backward id, stack)

    # -- hooks -----------------------------------------------------------------------------------
    def _install(self, stack: ExitStack) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        CALLS.subscribe(stack, each_pre=self._pre_forward)
        stack.callback(register_optimizer_step_pre_hook(self._pre_step).remove)
        stack.callback(register_optimizer_step_post_hook(self._post_step).remove)
        stack.callback(self._remove_param_hooks)
        for owner in (torch.optim.Optimizer, torch.nn.Module):
            _patch(stack, owner, "zero_grad", self._wrap_zero_grad)
        self._watch_grad_assignment(stack)

    def _watch_grad_assignment(self, stack: ExitStack) -> None:
        """``nn.Parameter.grad`` as a property over the tensor's own ``grad`` (same values; the setter
        notes a reset while gradients are pending) until ``stack`` closes."""
        cls = torch.nn.Parameter
        if "grad" in cls.__dict__:  # another observer's property is in place: leave it
            return
        base = torch._C.TensorBase.__dict__["grad"]
        probe = self

        def fget(p: torch.Tensor) -> Any:
            return base.__get__(p, type(p))

        def fset(p: torch.Tensor, value: Any) -> None:
            base.__set__(p, value)
            if probe._pending.get(id(p)):
                probe._check_reset(p, tuple(tuple(s) for s in instrument.user_stack(frame=sys._getframe(1))))

        def fdel(p: torch.Tensor) -> None:
            base.__delete__(p)
            if probe._pending.get(id(p)):
                probe._check_reset(p, tuple(tuple(s) for s in instrument.user_stack(frame=sys._getframe(1))))

        cls.grad = property(fget, fset, fdel, base.__doc__)  # type: ignore[assignment]
        stack.callback(delattr, cls, "grad")

    def _remove_param_hooks(self) -> None:
        for handles in self._hooked.values():
            for handle in handles:
                handle.remove()
        self._hooked.clear()

    def _hook(self, p: torch.Tensor) -> None:
        pid = id(p)
        if pid in self._hooked or not p.requires_grad or not p.is_leaf or \
                isinstance(p, torch.nn.parameter.UninitializedParameter):  # a lazy module before its first forward
            return
        ref = weakref.ref(p)

        def before(grad: torch.Tensor) -> None:
            param = ref()
            if param is not None and self._pending.get(pid):
                # a reset in place (or on a plain tensor), seen before the addition: at this backward
                self._check_reset(param, tuple(tuple(s) for s in instrument.user_stack()), zero=True)
            return None

        self._hooked[pid] = [p.register_hook(before), p.register_post_accumulate_grad_hook(self._accumulated)]

    def _pre_forward(self, module: torch.nn.Module, args: Any) -> None:
        for p in own_parameters(module):
            self._hook(p)
        return None

    def on_backward_begin(self, kind: str, roots: tuple, retain: bool, create_graph: bool) -> None:
        if kind == "backward":
            self.backwards += 1

    # -- state -----------------------------------------------------------------------------------
    def _check_reset(self, p: torch.Tensor, stack: tuple = (), zero: bool = True) -> None:
        """Record the pending backwards of ``p`` as discarded if its gradient was reset (``None``, or all
        zero when ``zero``)."""
        pending = self._pending.get(id(p))
        if not pending:
            return
        g = p.grad
        if g is None or (zero and not bool(g.detach().ne(0).any())):
            self._discards += [(id(p), b, stack) for b in pending]
            pending.clear()

    def _accumulated(self, p: torch.Tensor) -> None:
        g = p.grad
        if g is None:
            return
        if self._stepping.get(id(p)):  # inside a step (an L-BFGS closure): that step uses it
            self._used.add(self.backwards)
            return
        # one reduction and one host sync: max |g| is inf/NaN iff an element is, 0 iff all are
        largest = float(g.detach().abs().amax()) if g.numel() else 0.0
        pending = self._pending.setdefault(id(p), set())
        if not math.isfinite(largest):
            pending.clear()  # non-finite: a skip guard throws it away on purpose
        elif largest > 0:
            pending.add(self.backwards)

    def _wrap_zero_grad(self, original: Callable) -> Callable:
        probe = self

        def zero_grad(obj: Any, *args: Any, **kwargs: Any) -> Any:
            stack = None
            for p in _params(obj):
                if probe._pending.get(id(p)):
                    stack = stack if stack is not None else tuple(tuple(s) for s in instrument.user_stack())
                    probe._discards += [(id(p), b, stack) for b in probe._pending[id(p)]]
                    probe._pending[id(p)].clear()
            return original(obj, *args, **kwargs)

        zero_grad.__wrapped__ = original  # type: ignore[attr-defined]
        return zero_grad

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        for p in _params(optimizer):
            self._hook(p)
            self._stepped.add(id(p))
            self._stepping[id(p)] = self._stepping.get(id(p), 0) + 1
            self._check_reset(p, zero=False)

    def _post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.optimizer_steps += 1
        for p in _params(optimizer):
            n = self._stepping.get(id(p), 0)
            if n > 1:
                self._stepping[id(p)] = n - 1
            else:
                self._stepping.pop(id(p), None)
            pending = self._pending.get(id(p))
            if pending:
                self._used.update(pending)
                pending.clear()

    # -- decision --------------------------------------------------------------------------------
    def sample(self) -> dict:
        """``backwards``, optimizer ``steps``, ``discarded`` backwards (reset on stepped parameters, used by
        no step) and, per reset site (its stack), how many backwards it discarded."""
        discarded: set[int] = set()
        sites: dict[tuple, set[int]] = {}
        for pid, backward, stack in self._discards:
            if pid in self._stepped and backward not in self._used:
                discarded.add(backward)
                sites.setdefault(stack, set()).add(backward)
        return {"backwards": self.backwards, "steps": self.optimizer_steps, "discarded": len(discarded),
                "sites": [{"stack": [list(s) for s in stack], "discarded": len(b)}
                          for stack, b in sorted(sites.items(), key=lambda kv: -len(kv[1]))]}

    @classmethod
    def decide(cls, samples: dict[int, dict]) -> Measurement:
        """Defect iff a run discarded >= 1 backward's gradient; figures from the run at N."""
        s = samples[min(samples)]
        defect = any(v["discarded"] >= 1 for v in samples.values())
        display = f"discarded backwards: {s['discarded']}/{s['backwards']} ({s['steps']} optimizer steps)"
        findings = [_finding("TGL003", site["stack"], float(site["discarded"]), cls.unit,
                             f"a reset discarded {site['discarded']} backwards' gradients before a step used them")
                    for site in s["sites"]]
        if defect and not findings:
            findings = [_finding("TGL003", [], float(s["discarded"]), cls.unit, display)]
        return Measurement(cls.name, float(s["discarded"]), cls.unit, display, cls.threshold, defect,
                           {"runs": {str(k): v for k, v in samples.items()}}, findings)


# --------------------------------------------------------------------------------------------------
# TGL004: clipping that no step sees
# --------------------------------------------------------------------------------------------------


class _Clip:
    """One clipping call site: its cap and the parameters it clipped last."""

    def __init__(self, kind: str, cap: float, norm_type: float, stack: tuple) -> None:
        self.kind, self.cap, self.norm_type, self.stack = kind, cap, norm_type, stack
        self.params: list = []
        self.calls = 0
        self.empty = 0  # calls that found no gradient (all None or all zero)
        self.steps = 0  # optimizer steps over its parameters after it first ran
        self.above = 0  # of those, steps whose gradients exceeded the cap
        self.worst = 0.0  # largest measured / cap

    def measure(self, ids: set[int]) -> Optional[float]:
        """The clipped quantity (total norm, or max |g|) of this site's parameters in ``ids`` now."""
        grads = [p.grad.detach() for ref in self.params if (p := ref()) is not None and id(p) in ids
                 and p.grad is not None]
        if not grads:
            return None
        if self.kind == "value":
            return max(float(g.abs().max()) for g in grads if g.numel()) if any(g.numel() for g in grads) else 0.0
        norms = torch.stack([torch.linalg.vector_norm(g.float(), self.norm_type).cpu() for g in grads])
        return float(torch.linalg.vector_norm(norms, self.norm_type))


class ClipEffectProbe(Probe):
    """Optimizer steps whose gradients exceed the cap of a clip the program made.

    While observed, ``torch.nn.utils.clip_grad._clip_grads_with_norm_`` (which
    ``clip_grad_norm_`` calls however it was imported; ``_get_total_norm`` is
    wrapped too, for the norm type) and ``clip_grad_value_`` (the attributes of
    ``torch.nn.utils`` and ``torch.nn.utils.clip_grad``) are wrapped: each call
    site (the user's stack) records its cap and parameters. Before every
    optimizer step (global step pre-hook) each site whose parameters the
    optimizer steps measures the gradient the step is about to apply: the
    total norm (of the site's norm type) or max ``|g|``. A clip ordered
    ``backward -> clip -> step`` leaves it at or below the cap; a clip after the
    step, or before the backward, leaves the step's gradients unclipped.

    Figure: the largest measured / cap over steps (``x cap``) in the run at N.
    Threshold: defect when >= 1 step exceeds a cap by more than :data:`CAP_SLACK`
    (0.1 %). A cap of ``inf`` (norm logging) never counts; non-finite gradients
    are not counted (they are another defect).
    """

    name = "clip-effect"
    unit = "x cap"
    threshold = ">= 1 optimizer step whose gradients exceed the cap of a clip the program made on them by > 0.1 %"

    def __init__(self) -> None:
        super().__init__()
        self.sites: dict[tuple, _Clip] = {}
        self.optimizer_steps = 0
        self._norm_type = 2.0

    def _install(self, stack: ExitStack) -> None:
        import torch.nn.utils as utils
        import torch.nn.utils.clip_grad as clip_grad
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        stack.callback(register_optimizer_step_pre_hook(self._pre_step).remove)
        _patch(stack, clip_grad, "_get_total_norm", self._wrap_total_norm)
        _patch(stack, clip_grad, "_clip_grads_with_norm_", self._wrap_clip_norm)
        for owner in {clip_grad, utils}:
            _patch(stack, owner, "clip_grad_value_", self._wrap_clip_value)

    def _record(self, kind: str, params: list, cap: float, norm_type: float) -> None:
        key = tuple(tuple(s) for s in instrument.user_stack())
        site = self.sites.get(key)
        if site is None:
            site = self.sites[key] = _Clip(kind, float(cap), float(norm_type), key)
        site.cap, site.norm_type = float(cap), float(norm_type)
        site.params = [weakref.ref(p) for p in params if isinstance(p, torch.Tensor)]
        site.calls += 1
        if all(p.grad is None or not bool(p.grad.detach().ne(0).any()) for p in params
               if isinstance(p, torch.Tensor)):
            site.empty += 1

    def _wrap_total_norm(self, original: Callable) -> Callable:
        probe = self

        def _get_total_norm(tensors: Any, norm_type: Any = 2.0, *args: Any, **kwargs: Any) -> Any:
            probe._norm_type = float(norm_type)
            return original(tensors, norm_type, *args, **kwargs)

        return _get_total_norm

    def _wrap_clip_norm(self, original: Callable) -> Callable:
        probe = self

        def _clip_grads_with_norm_(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> Any:
            params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
            probe._record("norm", params, float(max_norm), probe._norm_type)
            probe._norm_type = 2.0
            return original(params, max_norm, *args, **kwargs)

        return _clip_grads_with_norm_

    def _wrap_clip_value(self, original: Callable) -> Callable:
        probe = self

        def clip_grad_value_(parameters: Any, clip_value: float, *args: Any, **kwargs: Any) -> Any:
            params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
            probe._record("value", params, float(clip_value), float("inf"))
            return original(params, clip_value, *args, **kwargs)

        return clip_grad_value_

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.optimizer_steps += 1
        ids = {id(p) for p in _params(optimizer)}
        for site in self.sites.values():
            if not site.params or site.cap == float("inf"):
                continue
            measured = site.measure(ids)
            if measured is None or measured != measured or measured == float("inf"):
                continue
            site.steps += 1
            ratio = measured / site.cap if site.cap > 0 else (float("inf") if measured > 0 else 0.0)
            site.worst = max(site.worst, ratio)
            if measured > site.cap * (1 + CAP_SLACK):
                site.above += 1

    def sample(self) -> dict:
        """Optimizer ``steps`` and per clip site: kind, cap, calls, calls on empty gradients, steps over its
        parameters, steps above its cap and the worst measured / cap."""
        return {"steps": self.optimizer_steps,
                "sites": [{"stack": [list(s) for s in site.stack], "kind": site.kind, "cap": site.cap,
                           "calls": site.calls, "empty": site.empty, "steps": site.steps, "above": site.above,
                           "worst": site.worst} for site in self.sites.values()]}

    @classmethod
    def decide(cls, samples: dict[int, dict]) -> Measurement:
        """Defect iff a run has >= 1 step above a clip's cap; figures from the run at N."""
        s = samples[min(samples)]
        defect = any(site["above"] >= 1 for v in samples.values() for site in v["sites"])
        findings = [_finding("TGL004", site["stack"], site["worst"], cls.unit,
                             f"{site['above']}/{site['steps']} steps above the cap {site['cap']:g} "
                             f"(up to {site['worst']:.3g}x)")
                    for site in s["sites"] if site["above"]]
        capped = [site for site in s["sites"] if site["cap"] != float("inf")]
        worst = max(capped, key=lambda site: site["worst"], default=None)
        if worst is None:
            calls = sum(site["calls"] for site in s["sites"])
            display = (f"no capped clip ({calls} clip calls with an infinite cap: norm logging; "
                       f"{s['steps']} optimizer steps)")
            figure = 0.0
        else:
            figure = float(worst["worst"])
            display = (f"steps above the clip cap: {worst['above']}/{worst['steps']}, applied "
                       f"{'norm' if worst['kind'] == 'norm' else 'max |g|'} up to {figure:.3g}x the cap "
                       f"{worst['cap']:g}")
            if worst["empty"]:
                display += f"; {worst['empty']}/{worst['calls']} clips found no gradient"
        return Measurement(cls.name, figure, cls.unit, display, cls.threshold, defect,
                           {"runs": {str(k): v for k, v in samples.items()}}, findings)


STEP_PROBES: dict[str, type[Probe]] = {p.name: p for p in (DiscardedGradientProbe, ClipEffectProbe)}
