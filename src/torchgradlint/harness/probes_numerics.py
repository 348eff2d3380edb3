"""Probes for the numerics and custom-autograd rules (TGL104, TGL303, TGL304, TGL305).

=================  ===========  ==========================================================
probe              rules        defect when
=================  ===========  ==========================================================
gradcheck-power    TGL304       >= 1 gradcheck/gradgradcheck call that cannot tell right
                                from wrong: the correct function fails it, or the same
                                function with a backward 1 % too large passes it
ctx-tensors        TGL104       >= 1 custom-Function output stored on its ctx and freed
                                by the cyclic garbage collector (held only by the ctx
                                reference cycle; gc stays on, its runs are watched),
                                or >= 1 backward that read a tensor stored on ctx after it
                                was modified in place (a silently wrong gradient)
nan-parameters     TGL305       >= 1 non-finite parameter element after an optimizer step
probability-input  TGL303       >= 1 cross_entropy/nll_loss call whose input rows are
                                probabilities or sigmoid outputs, kl_div call whose
                                input rows are probabilities, or
                                binary_cross_entropy_with_logits call whose input is a
                                sigmoid output (the loss has a floor above 0), or
                                torch.log / Tensor.log of a softmax output (-inf where a
                                probability underflows)
=================  ===========  ==========================================================
"""

from __future__ import annotations

import gc
import sys
import weakref
from contextlib import ExitStack
from typing import Any, Callable, Optional

import torch

from .interrupts import no_raise
from .probe_base import Measurement, Probe, human_bytes, merge_stacks

# --------------------------------------------------------------------------------------------------
# TGL304: gradcheck resolving power
# --------------------------------------------------------------------------------------------------

#: the relative error of the skewed backward the re-check must catch (1 %)
SKEW = 1.01


class _SkewedGrad(torch.autograd.Function):
    """Identity in forward; backward returns the incoming gradient times :data:`SKEW`."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * SKEW


def skew_backward(func: Callable) -> Callable:
    """``func`` with every differentiable tensor argument routed through :class:`_SkewedGrad`:
    the same values (so the same numerical Jacobian), an analytical Jacobian 1 % too large."""
    def skewed(*args: Any) -> Any:
        return func(*[_SkewedGrad.apply(a) if isinstance(a, torch.Tensor) and a.requires_grad else a
                      for a in args])
    return skewed


def _passes(helper: Callable, args: dict) -> bool:
    from torch.autograd.gradcheck import GradcheckError

    try:
        return bool(helper(**args))
    except GradcheckError:
        return False


class GradcheckPowerProbe(Probe):
    """Re-runs every ``gradcheck``/``gradgradcheck`` of the fixture twice to measure whether it can
    tell a right backward from a wrong one.

    The probe wraps ``torch.autograd.gradcheck._gradcheck_helper`` (the function every public
    ``gradcheck`` and ``gradgradcheck`` spelling ends in, whatever name the fixture imported), and
    for each call, with the same inputs and the same ``eps``/``atol``/``rtol``, checks (1) the
    function as given (a fixture's functions have correct backward formulas) and (2) the function
    with a backward exactly 1 % too large (:func:`skew_backward`). A sound check passes (1) and
    fails (2); in float64 with default tolerances it does.

    Figure: unreliable checks (count) in the run at N: (1) failed or (2) passed.
    Threshold: defect when >= 1 unreliable check. Attribution: the ``gradcheck``/``gradgradcheck`` call.
    """

    name = "gradcheck-power"
    unit = "checks"
    threshold = (">= 1 gradcheck that fails the correct backward or passes a backward 1 % too large "
                 "(same inputs and tolerances)")
    handles_exceptions = True

    def __init__(self) -> None:
        super().__init__()
        self.checks = 0
        self.correct_failed = 0
        self.skewed_passed = 0
        self.unreliable = 0
        self.dtypes: set[str] = set()
        self._inside = False

    def _install(self, stack: ExitStack) -> None:
        module = sys.modules["torch.autograd.gradcheck"]
        orig = module._gradcheck_helper

        def helper(**args: Any) -> Any:
            if self._inside:
                return orig(**args)
            self._inside = True
            try:
                self._measure(orig, args)
            finally:
                self._inside = False
            return orig(**args)

        module._gradcheck_helper = helper
        stack.callback(setattr, module, "_gradcheck_helper", orig)

    def _measure(self, orig: Callable, args: dict) -> None:
        inputs = args["inputs"] if isinstance(args["inputs"], (tuple, list)) else (args["inputs"],)
        for t in inputs:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                self.dtypes.add(str(t.dtype).replace("torch.", ""))
        self.checks += 1
        correct = _passes(orig, args)
        skewed = _passes(orig, dict(args, func=skew_backward(args["func"])))
        self.correct_failed += not correct
        self.skewed_passed += skewed
        self.unreliable += (not correct) or skewed
        if not correct or skewed:
            what = "gradcheck fails the correct backward" if not correct else \
                "gradcheck passes a backward 1 % too large"
            self.attribute("TGL304", f"{what} (eps {args.get('eps')}, atol {args.get('atol')}, "
                                     f"rtol {args.get('rtol')}; inputs {', '.join(sorted(self.dtypes)) or '-'})")

    def on_exception(self, exc: BaseException) -> bool:
        from torch.autograd.gradcheck import GradcheckError

        return isinstance(exc, GradcheckError) and self.checks > 0

    def sample(self) -> dict:
        """``checks``, ``unreliable`` ones, ``correct_failed``, ``skewed_passed``, differentiable input ``dtypes``."""
        return {"checks": self.checks, "unreliable": self.unreliable, "correct_failed": self.correct_failed,
                "skewed_passed": self.skewed_passed, "dtypes": sorted(self.dtypes)}

    @classmethod
    def decide(cls, samples: dict[int, dict]) -> Measurement:
        """Defect iff a run has >= 1 check that fails the correct or passes the 1 %-wrong backward."""
        s = samples[min(samples)]
        bad = s["unreliable"]
        defect = any(v["unreliable"] >= 1 for v in samples.values())
        display = (f"unreliable gradchecks: {bad}/{s['checks']} (correct backward failed {s['correct_failed']}, "
                   f"1 %-wrong backward passed {s['skewed_passed']}; inputs {', '.join(s['dtypes']) or '-'})")
        return Measurement(cls.name, float(bad), cls.unit, display, cls.threshold, defect,
                           {"runs": {str(k): v for k, v in samples.items()}})


# --------------------------------------------------------------------------------------------------
# TGL104: tensors stored on a custom Function's ctx
# --------------------------------------------------------------------------------------------------


def _tensors_in(value: Any) -> list[torch.Tensor]:
    """Tensors in ``value`` or directly inside a tuple/list/dict ``value``."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


class CtxTensorProbe(Probe):
    """Measures the two costs of tensors kept as ``ctx`` attributes of custom autograd Functions.

    The probe wraps ``_SingleLevelFunction.apply`` (what ``Function.apply`` calls through
    ``super()``, so every ``MyFn.apply`` spelling is seen) and ``BackwardCFunction.apply`` (what the
    autograd engine calls to run a custom backward). After each forward it takes a weak reference to
    every output and records, for every tensor stored in ``ctx.__dict__``, its version counter
    (``Tensor._version``). Before each backward it compares the versions: a stored tensor modified in
    place since forward means backward computes with changed values, silently (``save_for_backward``
    checks the version and raises). Each output stored on its own ctx gets a weak reference whose
    callback notes whether the output is freed *by the cyclic garbage collector* (a ``gc.callbacks``
    entry marks the collector's runs): such an output was held only by the reference cycle output ->
    ``grad_fn`` = ctx -> output, a dead output that waited for the collector. When the run ends one
    ``gc.collect()`` frees those still waiting (not those ``main``'s locals held at its return). The
    collector keeps running as usual: nothing is disabled.

    Attribution: the line that stored the tensor on ``ctx`` (``ctx.out = out``), seen by a
    ``__setattr__`` on ``BackwardCFunction`` (the class of every custom Function's ctx) while a
    forward or ``setup_context`` runs; else the ``.apply`` call.
    Figure: dead outputs kept alive plus stale ctx tensors read by backward (count) in the run at N.
    Threshold: defect when >= 1.
    """

    name = "ctx-tensors"
    unit = "tensors"
    needs_frame = True
    threshold = (">= 1 custom-Function output stored on its ctx and freed only by the cyclic garbage collector "
                 "(the ctx reference cycle), or >= 1 ctx-attribute tensor modified in place before backward read it")

    def __init__(self) -> None:
        super().__init__()
        self.forwards = 0
        self.backwards = 0
        self.ctx_tensors = 0
        self.stale_reads = 0
        self.dead_outputs = 0
        self.dead_bytes = 0
        # outputs stored on their own ctx: weakref -> (output id, bytes, ctx attribute, stack of the store)
        self._outputs: dict[weakref.ref, tuple[int, int, str, list]] = {}
        self._collecting = False  # the cyclic collector is running
        self._main_locals: set[int] = set()
        self._versions: dict[int, list[tuple[weakref.ref, int, str, list]]] = {}
        self._forward_depth = 0
        self._stores: dict[int, dict[str, list]] = {}  # id(ctx) -> attribute -> stack of the store

    def _install(self, stack: ExitStack) -> None:
        from torch.autograd.function import BackwardCFunction, _SingleLevelFunction

        probe = self
        gc.callbacks.append(self._gc_phase)
        stack.callback(gc.callbacks.remove, self._gc_phase)

        def forward_apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
            probe._forward_depth += 1
            try:
                result = super(_SingleLevelFunction, cls).apply(*args, **kwargs)
            finally:
                probe._forward_depth -= 1
            probe._after_forward(result)
            return result

        had_setattr = "__setattr__" in vars(BackwardCFunction)
        orig_setattr = BackwardCFunction.__setattr__

        def ctx_setattr(ctx: Any, name: str, value: Any) -> None:
            if probe._forward_depth and _tensors_in(value):
                probe._stores.setdefault(id(ctx), {})[name] = probe.user_stack()
            orig_setattr(ctx, name, value)

        orig_backward = BackwardCFunction.apply

        def backward_apply(ctx: Any, *args: Any) -> Any:
            probe._before_backward(ctx)
            return orig_backward(ctx, *args)

        _SingleLevelFunction.apply = classmethod(forward_apply)  # type: ignore[method-assign]
        BackwardCFunction.apply = backward_apply  # type: ignore[method-assign]
        BackwardCFunction.__setattr__ = ctx_setattr  # type: ignore[method-assign,assignment]
        stack.callback(delattr, _SingleLevelFunction, "apply")
        stack.callback(setattr, BackwardCFunction, "apply", orig_backward)
        if had_setattr:  # pragma: no cover - torch defines none today
            stack.callback(setattr, BackwardCFunction, "__setattr__", orig_setattr)
        else:
            stack.callback(delattr, BackwardCFunction, "__setattr__")
        stack.callback(self._count_dead_outputs)  # runs first: main has returned

    def _after_forward(self, result: Any) -> None:
        self.forwards += 1
        outputs = _tensors_in(result)
        ctx = next((t.grad_fn for t in outputs if t.grad_fn is not None), None)
        stores = self._stores.pop(id(ctx), {}) if ctx is not None else {}
        stored = [(name, t) for name, v in (vars(ctx).items() if ctx is not None else ()) for t in _tensors_in(v)]
        apply_stack = self.user_stack() if stored else []
        where = {id(t): (name, stores.get(name) or apply_stack) for name, t in stored}
        for t in outputs:
            if id(t) in where:  # an output stored on its own ctx: a reference cycle through grad_fn
                name, stack = where[id(t)]
                self._outputs[weakref.ref(t, self._freed)] = (id(t), t.numel() * t.element_size(), name, stack)
        if ctx is None:
            return
        self.ctx_tensors += len(stored)
        self._versions[id(ctx)] = [(weakref.ref(t), t._version, name, stores.get(name) or apply_stack)
                                   for name, t in stored]

    def _before_backward(self, ctx: Any) -> None:
        self.backwards += 1
        for ref, version, name, stack in self._versions.pop(id(ctx), ()):
            t = ref()
            if t is not None and t._version != version:
                self.stale_reads += 1
                self.attribute("TGL104", f"backward read ctx.{name} after it was modified in place", stack=stack)

    def on_main_return(self, frame: Any) -> None:
        """Remember the tensors ``main``'s locals hold at its return: they were alive legitimately, and a
        lazy import inside torch can leave ``main``'s frame in an unrelated garbage cycle."""
        self._main_locals = {id(t) for v in frame.f_locals.values() for t in _tensors_in(v)}

    @no_raise
    def _gc_phase(self, phase: str, info: dict) -> None:
        self._collecting = phase == "start"

    @no_raise
    def _freed(self, ref: weakref.ref) -> None:
        """An output stored on its own ctx was freed: a dead output when the cyclic collector freed it."""
        rec = self._outputs.pop(ref, None)
        if rec is None or not self._collecting or rec[0] in self._main_locals:
            return  # freed by reference counting (the cycle was broken), or held by main at its return
        _, size, name, stack = rec
        self.dead_outputs += 1
        self.dead_bytes += size
        self.attribute("TGL104", f"output stored as ctx.{name} kept alive by a reference cycle until "
                                 f"gc.collect()", stack=stack)

    def _count_dead_outputs(self) -> None:
        """The run ended (``main`` returned): collect once, so that dead outputs still waiting are counted."""
        gc.collect()
        self._outputs.clear()

    def sample(self) -> dict:
        """Counts: ``forwards``/``backwards`` of custom Functions, ``ctx_tensors`` stored as attributes,
        ``stale_reads``, ``dead_outputs`` and ``dead_bytes`` alive after ``main`` returned."""
        return {"forwards": self.forwards, "backwards": self.backwards, "ctx_tensors": self.ctx_tensors,
                "stale_reads": self.stale_reads, "dead_outputs": self.dead_outputs, "dead_bytes": self.dead_bytes}

    @classmethod
    def decide(cls, samples: dict[int, dict]) -> Measurement:
        """Defect iff a run has >= 1 dead output held by a cycle or >= 1 stale ctx tensor read."""
        s = samples[min(samples)]
        figure = s["dead_outputs"] + s["stale_reads"]
        defect = any(v["dead_outputs"] + v["stale_reads"] >= 1 for v in samples.values())
        display = (f"dead outputs alive: {s['dead_outputs']} ({human_bytes(s['dead_bytes'])}), in-place-modified "
                   f"ctx tensors read by backward: {s['stale_reads']} ({s['ctx_tensors']} ctx tensors, "
                   f"{s['forwards']} forwards)")
        return Measurement(cls.name, float(figure), cls.unit, display, cls.threshold, defect,
                           {"runs": {str(k): v for k, v in samples.items()}})


# --------------------------------------------------------------------------------------------------
# TGL305: parameters turned non-finite by an optimizer step
# --------------------------------------------------------------------------------------------------


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every element of every tensor is finite: one max-abs per tensor (``torch._foreach_norm`` with
    ``ord=inf``, NaN and inf propagate) and one host sync per dtype, instead of a count per tensor."""
    try:
        norms = torch._foreach_norm(tensors, float("inf"))
    except (RuntimeError, TypeError):  # sparse or exotic tensors
        return all(bool(torch.isfinite(t).all()) for t in tensors)
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for n in norms:
        by_dtype.setdefault(n.dtype, []).append(n)
    return all(bool(torch.isfinite(torch.stack(ns)).all()) for ns in by_dtype.values())


def _eps_vanishes(group: dict, dtype: torch.dtype) -> bool:
    """Whether the parameter group's ``eps`` (a float) rounds to 0 in ``dtype``."""
    eps = group.get("eps")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or eps <= 0:
        return False
    return float(torch.tensor(float(eps), dtype=dtype)) == 0.0


class NanParameterProbe(Probe):
    """Counts parameter elements an optimizer step turned into NaN or infinity.

    A global optimizer step post-hook (:func:`torch.optim.optimizer.register_optimizer_step_post_hook`)
    counts, after every ``step()``, the non-finite elements of every parameter the optimizer owns in
    a dtype where its parameter group's ``eps`` rounds to 0 (the rule's cause; an optimizer without
    ``eps``, or float32 parameters, diverging to NaN is another defect), and the parameters' dtypes. Parameters are initialised finite by every fixture, so a non-finite
    element is the step's doing (Adam's ``0 / (0 + eps)`` with eps rounded to 0 in float16).

    Attribution: where the optimizer was built (a wrapper around ``torch.optim.Optimizer.__init__``,
    which every optimizer calls; its settings and the parameters' dtype are the defect), then the
    ``step()`` after which an element first turned non-finite.
    Figure: non-finite parameter elements after the last step of the run at N, out of all elements.
    Threshold: defect when >= 1.
    """

    name = "nan-parameters"
    unit = "elements"
    threshold = ">= 1 NaN/inf parameter element after an optimizer step, in a dtype where the group's eps rounds to 0"

    def __init__(self) -> None:
        super().__init__()
        self.steps_total = 0
        self.nonfinite = 0
        self.elements = 0
        self.first_bad_step: Optional[int] = None
        self.dtypes: set[str] = set()
        self._dtypes: set[torch.dtype] = set()
        self._built: "weakref.WeakKeyDictionary[Any, list]" = weakref.WeakKeyDictionary()
        self._bad: dict[int, dict] = {}  # id(optimizer) -> its attributed site

    def _install(self, stack: ExitStack) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        probe = self
        orig_init = torch.optim.Optimizer.__init__

        def init(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            orig_init(optimizer, *args, **kwargs)
            try:
                probe._built[optimizer] = probe.user_stack()
            except TypeError:  # pragma: no cover - an optimizer class that forbids weak references
                pass

        torch.optim.Optimizer.__init__ = init  # type: ignore[method-assign]
        stack.callback(setattr, torch.optim.Optimizer, "__init__", orig_init)
        stack.callback(register_optimizer_step_post_hook(self._post_step).remove)

    def _post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.steps_total += 1
        # TGL305's defect: parameters of a dtype in which the group's eps rounds to 0 (Adam's eps=1e-8 in
        # float16); a float32 SGD step that diverges to NaN is another defect
        params = [p for group in optimizer.param_groups for p in group["params"]
                  if isinstance(p, torch.Tensor) and p.is_floating_point() and _eps_vanishes(group, p.dtype)]
        for p in params:
            if p.dtype not in self._dtypes:
                self._dtypes.add(p.dtype)
                self.dtypes.add(str(p.dtype).replace("torch.", ""))
        total = sum(p.numel() for p in params)
        bad = 0
        with torch.no_grad():
            if params and not all_finite(params):  # the exact count only when something is not finite
                bad = sum(int((~torch.isfinite(p)).sum()) for p in params)
        self.nonfinite, self.elements = bad, total
        if bad and self.first_bad_step is None:
            self.first_bad_step = self.steps_total
        if bad:
            site = self._bad.get(id(optimizer))
            if site is None:
                stack = merge_stacks((self._built.get(optimizer) or [])[:1], self.user_stack())
                site = self._bad[id(optimizer)] = self.attribute(
                    "TGL305", f"{type(optimizer).__name__} step turned parameters ({', '.join(sorted(self.dtypes))}) "
                              f"non-finite from step {self.steps_total}", amount=0, stack=stack)
            site["count"] = max(site["count"], bad)

    def sample(self) -> dict:
        """``steps_total``, ``nonfinite`` of ``elements`` after the last step, ``first_bad_step``, ``dtypes``."""
        return {"steps_total": self.steps_total, "nonfinite": self.nonfinite, "elements": self.elements,
                "first_bad_step": self.first_bad_step, "dtypes": sorted(self.dtypes)}

    @classmethod
    def decide(cls, samples: dict[int, dict]) -> Measurement:
        """Defect iff a run ends with >= 1 non-finite parameter element."""
        s = samples[min(samples)]
        defect = any(v["nonfinite"] >= 1 for v in samples.values())
        display = (f"non-finite parameter elements: {s['nonfinite']}/{s['elements']} after {s['steps_total']} "
                   f"steps ({', '.join(s['dtypes']) or '-'})")
        if s["first_bad_step"] is not None:
            display += f", first at step {s['first_bad_step']}"
        return Measurement(cls.name, float(s["nonfinite"]), cls.unit, display, cls.threshold, defect,
                           {"runs": {str(k): v for k, v in samples.items()}})


# --------------------------------------------------------------------------------------------------
# TGL303: probabilities fed to losses that expect logits
# --------------------------------------------------------------------------------------------------

_SIMPLEX_TOL = 1e-3


def _class_last(x: torch.Tensor) -> torch.Tensor:
    """``(N, C, d1, ...)`` -> ``(N * d1 * ..., C)``; ``(C,)`` -> ``(1, C)``."""
    if x.dim() == 1:
        return x.unsqueeze(0)
    return x.movedim(1, -1).reshape(-1, x.shape[1])


def ce_floor(classes: int) -> float:
    """The smallest cross-entropy a probability input can reach (nats): the softmax of a one-hot row,
    ``log(e + C - 1) - 1`` (1.461 for 10 classes)."""
    import math

    return math.log(math.e + classes - 1) - 1


def logit_gradient_ratio(probs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per row: the norm of the gradient that reaches the logits through ``softmax`` then
    ``cross_entropy`` over the norm ``cross_entropy`` on the logits would give (``p - onehot``)."""
    onehot = torch.nn.functional.one_hot(target, probs.shape[1]).to(probs.dtype)
    g_in = torch.softmax(probs, dim=1) - onehot  # d CE(p) / d p
    through = probs * g_in - probs * (probs * g_in).sum(1, keepdim=True)  # softmax Jacobian^T g_in
    return through.norm(dim=1) / (probs - onehot).norm(dim=1).clamp_min(1e-12)


_SIGMOIDS = frozenset({"SigmoidBackward0"})
_SOFTMAXES = frozenset({"SoftmaxBackward0"})
#: autograd nodes that only move, view or cast values (followed back to the op that made them)
_PASS_THROUGH = frozenset({"ViewBackward0", "ReshapeAliasBackward0", "UnsafeViewBackward0", "UnsqueezeBackward0",
                           "SqueezeBackward0", "SqueezeBackward1", "SqueezeBackward2", "TBackward0",
                           "PermuteBackward0", "TransposeBackward0", "ExpandBackward0", "SelectBackward0",
                           "SliceBackward0", "CloneBackward0", "ToCopyBackward0", "IndexBackward0",
                           "CatBackward0", "StackBackward0", "AliasBackward0",
                           # picks of elements: probabilities stay probabilities
                           "GatherBackward0", "IndexSelectBackward0", "MaskedSelectBackward0"})


def produced_by(grad_fn: Any, names: "frozenset[str]", depth: int = 8) -> bool:
    """Whether the autograd node ``grad_fn`` is, or reaches through view/copy nodes only, a node named in ``names``."""
    fn = grad_fn
    for _ in range(depth):
        if fn is None:
            return False
        kind = type(fn).__name__
        if kind in names:
            return True
        if kind not in _PASS_THROUGH:
            return False
        fn = next((nxt for nxt, _ in fn.next_functions if nxt is not None), None)
    return False


class ProbabilityInputProbe(Probe):
    """Inspects the input of every ``cross_entropy`` / ``nll_loss`` / ``binary_cross_entropy_with_logits``
    / ``kl_div`` call (the module losses call these too) for probabilities.

    A call counts when the input's class rows all lie on the probability simplex (values in [0, 1],
    row sums 1 within 1e-3) for ``cross_entropy``/``nll_loss``, or lie in [0, 1] and were made by
    ``sigmoid`` (a code head ending in ``nn.Sigmoid``: the same floor), or, for
    ``binary_cross_entropy_with_logits``, all input values lie in [0, 1] and, when autograd recorded
    how the input was made, it was made by ``sigmoid`` (its ``grad_fn``, through view and copy nodes:
    :func:`produced_by`; the logits of a fresh discriminator often lie in [0, 1] too).
    Such a loss has a floor above 0: ``log(e + C - 1) - 1`` nats
    for cross-entropy with C classes, ``log(1 + e**-1) = 0.313`` (target 1) to 0.693 (target 0) for
    BCE-with-logits. For cross-entropy with class-index targets the probe also measures how much of
    the gradient reaches the logits through the softmax, relative to cross-entropy on the logits
    (median over samples).

    ``torch.log`` / ``Tensor.log`` of a tensor made by ``softmax`` (through views, copies and element
    picks such as ``gather``) counts too: it is ``-inf`` wherever a probability underflowed (the figure
    counts those values), where ``log_softmax`` is exact.

    ``kl_div`` counts when its input rows lie on the simplex: its input is log-probabilities, and
    given probabilities ``sum(t * (log t - p))`` is no divergence (it goes below 0; a student trained
    on it collapses onto the target's most likely class).

    Attribution: the user's line that called the loss (``criterion(probs, y)``, ``F.nll_loss(...)``).
    Figure: loss calls with probability inputs (count) in the run at N. Threshold: defect when >= 1.
    """

    name = "probability-input"
    unit = "calls"
    threshold = (">= 1 cross_entropy/nll_loss call whose input rows are probabilities or sigmoid outputs, "
                 "kl_div call whose input rows are probabilities (it expects log-probabilities), or "
                 "binary_cross_entropy_with_logits call whose input is a sigmoid output (a loss floor above 0), "
                 "or log of a softmax output")

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.probability_calls = 0
        self.losses: set[str] = set()
        self.floor: Optional[float] = None
        self.ratios: list[float] = []
        self.infinite = 0  # -inf values out of log(softmax) calls
        self._inside = False

    def _install(self, stack: ExitStack) -> None:
        import torch.nn.functional as F

        for name in ("cross_entropy", "nll_loss", "binary_cross_entropy_with_logits", "kl_div"):
            orig = getattr(F, name)
            setattr(F, name, self._wrap(name, orig))
            stack.callback(setattr, F, name, orig)
        for owner in (torch, torch.Tensor):  # torch.log(p) and p.log()
            orig = owner.log
            setattr(owner, "log", self._wrap_log(orig))
            stack.callback(setattr, owner, "log", orig)

    def _wrap_log(self, orig: Callable) -> Callable:
        def log(input: Any, *args: Any, **kwargs: Any) -> Any:
            out = orig(input, *args, **kwargs)
            if not self._inside and isinstance(input, torch.Tensor) and input.grad_fn is not None \
                    and produced_by(input.grad_fn, _SOFTMAXES):
                self._inside = True
                try:
                    with torch.no_grad():
                        infinite = int((~torch.isfinite(out)).sum()) if isinstance(out, torch.Tensor) else 0
                    self.calls += 1
                    self.probability_calls += 1
                    self.infinite += infinite
                    self.losses.add("log")
                    self.attribute("TGL303", "log of a softmax output" +
                                   (f" ({infinite} values -inf: a probability underflowed)" if infinite else ""))
                finally:
                    self._inside = False
            return out

        log.__wrapped__ = orig  # type: ignore[attr-defined]
        return log

    def _wrap(self, name: str, orig: Callable) -> Callable:
        def wrapper(input: Any, target: Any, *args: Any, **kwargs: Any) -> Any:
            if not self._inside and isinstance(input, torch.Tensor) and isinstance(target, torch.Tensor):
                self._inside = True
                try:
                    with torch.no_grad():
                        self._inspect(name, input.detach().float(), target.detach(), input.grad_fn)
                finally:
                    self._inside = False
            return orig(input, target, *args, **kwargs)

        wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
        return wrapper

    def _inspect(self, name: str, x: torch.Tensor, target: torch.Tensor, grad_fn: Any = None) -> None:
        self.calls += 1
        if x.numel() == 0 or not bool(torch.isfinite(x).all()) or not (bool((x >= 0).all()) and bool((x <= 1).all())):
            return
        if name == "binary_cross_entropy_with_logits":
            if grad_fn is not None and not produced_by(grad_fn, _SIGMOIDS):  # logits that lie in [0, 1]
                return
            self.probability_calls += 1
            self.losses.add(name)
            self.floor = min(self.floor if self.floor is not None else 1.0, 0.3133)
            self.attribute("TGL303", f"{name} fed values in [0, 1] (loss floor 0.313 nats)")
            return
        rows = _class_last(x)
        if rows.shape[1] < 2:
            return
        if not bool(((rows.sum(1) - 1).abs() <= _SIMPLEX_TOL).all()):
            # not a softmax: a sigmoid's outputs lie in (0, 1) too, and cross-entropy's log_softmax
            # of them has the same floor (a one-hot row is the best they can do)
            if name == "kl_div" or grad_fn is None or not produced_by(grad_fn, _SIGMOIDS):
                return
            self.probability_calls += 1
            self.losses.add(name)
            self.attribute("TGL303", f"{name} fed sigmoid outputs" +
                           (f" (loss floor {ce_floor(rows.shape[1]):.3f} nats)" if name == "cross_entropy" else ""))
            if name == "cross_entropy":
                self.floor = ce_floor(rows.shape[1])
            return
        self.probability_calls += 1
        self.losses.add(name)
        if name == "kl_div":  # its input is log-probabilities: given probabilities it is no divergence
            self.attribute("TGL303", "kl_div fed probabilities as its input (it expects log-probabilities)")
            return
        self.attribute("TGL303", f"{name} fed probabilities" +
                       (f" (loss floor {ce_floor(rows.shape[1]):.3f} nats)" if name == "cross_entropy" else ""))
        if name == "cross_entropy":
            self.floor = ce_floor(rows.shape[1])
            if target.dtype in (torch.int64, torch.int32) and target.numel() == rows.shape[0]:
                ratio = logit_gradient_ratio(rows, target.reshape(-1).long())
                self.ratios.append(float(ratio.median()))

    def sample(self) -> dict:
        """``calls``, ``probability_calls``, ``losses`` involved, the ``floor`` (nats) and the median
        logit-gradient ``ratio`` over the calls (``None`` where not measured)."""
        ratio = sorted(self.ratios)[len(self.ratios) // 2] if self.ratios else None
        return {"calls": self.calls, "probability_calls": self.probability_calls, "losses": sorted(self.losses),
                "floor": self.floor, "ratio": ratio, "infinite": self.infinite}

    @classmethod
    def decide(cls, samples: dict[int, dict]) -> Measurement:
        """Defect iff a run has >= 1 loss call fed probabilities."""
        s = samples[min(samples)]
        defect = any(v["probability_calls"] >= 1 for v in samples.values())
        display = f"probability inputs: {s['probability_calls']}/{s['calls']} loss calls"
        if s["losses"]:
            display += f" ({', '.join(s['losses'])})"
        if s["floor"] is not None:
            display += f", loss floor {s['floor']:.3f} nats"
        if s["ratio"] is not None:
            display += f", logit gradient x{s['ratio']:.3g} (median)"
        if s.get("infinite"):
            display += f", {s['infinite']} -inf values out of log(softmax)"
        return Measurement(cls.name, float(s["probability_calls"]), cls.unit, display, cls.threshold, defect,
                           {"runs": {str(k): v for k, v in samples.items()}})


NUMERICS_PROBES: tuple[type[Probe], ...] = (GradcheckPowerProbe, CtxTensorProbe, NanParameterProbe,
                                            ProbabilityInputProbe)
