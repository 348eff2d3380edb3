"""Probes for the rules about model structure and evaluation behaviour.

=================  ===========  ==========================================================
probe              rules        defect when
=================  ===========  ==========================================================
unused-graph       TGL103       >= 1 top-level module forward recorded an autograd graph
                                that no backward ever used, in a file where a
                                no_grad()/inference_mode() was built and never entered
eval-spread        TGL203       the mean std of repeated eval-mode predictions of a model
                                the program ran is > 1e-6 with a dropout call active in
                                them (eval forwards must be deterministic)
unoptimized-grads  TGL006,      >= 1 tensor held by a plain list/dict/tensor module
                   TGL007       attribute, or parameter of a module built in a forward,
                                received a gradient from a backward but is in no
                                parameter group of any optimizer that stepped
=================  ===========  ==========================================================

Each probe observes the fixture from outside (global module hooks, optimizer
step hooks, the backward notifications of :mod:`.instrument`), like those of
:mod:`.probes`.
"""

from __future__ import annotations

import sys
import weakref
from contextlib import ExitStack
from typing import Any, Iterator, Optional

import torch
from torch.overrides import TorchFunctionMode

from . import instrument
from .holders import graph_leaves
from .module_calls import CALLS
from .probe_base import Measurement, Probe, merge_stacks


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """Tensors in a forward's output: a tensor, or one inside a tuple, list or dict (one level)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            if isinstance(v, torch.Tensor):
                yield v
    elif isinstance(value, dict):
        for v in value.values():
            if isinstance(v, torch.Tensor):
                yield v


# --------------------------------------------------------------------------------------------------
# TGL103: graphs recorded for nothing
# --------------------------------------------------------------------------------------------------


class UnusedGraphProbe(Probe):
    """Top-level module forwards whose recorded autograd graph no backward used.

    A global forward hook sees every top-level module call (one not nested in
    another module's forward). When an output tensor has a ``grad_fn`` (grad
    mode was on: autograd recorded the graph and saved the activations for
    backward), a tensor hook (:meth:`torch.Tensor.register_hook`) is put on it;
    the hook fires when a backward propagates through that output. A forward
    whose outputs no backward ever reached recorded its graph for nothing: what
    ``with torch.no_grad():`` around an evaluation would have avoided.

    Such a forward counts when the user's code built a ``torch.no_grad()`` /
    ``torch.inference_mode()`` in a file on the forward's call stack and never entered
    it (:func:`.instrument.discarded_grad_mode_sites`: a bare statement, the grad-mode
    switch that was meant to stop the recording); forwards with an unused graph and no
    such switch (an evaluation written without ``no_grad``) are only listed
    (``unused_any``). Attribution: the switch's line, then the line that called the module.
    Figure: counted forwards in the run at N, out of all top-level forwards.
    Threshold: defect when >= 1 (a training forward is always backpropagated;
    an evaluation forward under ``no_grad``/``inference_mode`` records no graph).
    """

    name = "unused-graph"
    unit = "forwards"
    threshold = (">= 1 top-level module forward recorded an autograd graph that no backward used, in a file where "
                 "a no_grad()/inference_mode() was built and never entered")

    def __init__(self) -> None:
        super().__init__()
        self.forwards = 0
        self.recorded = 0
        self._calls: dict[tuple, list] = {}  # call stack -> [forwards that recorded a graph, of them used]
        self._stacks: dict[Any, tuple] = {}  # (code, line) of the innermost user frame -> its call stack

    def _stack(self) -> tuple:
        """The user's call stack of the module call, computed once per innermost user line (a training loop
        calls the model from one line: one walk of the whole stack, then a few frames per call)."""
        f = sys._getframe(2)
        while f is not None and not instrument.is_user_file(f.f_code.co_filename):
            f = f.f_back
        key = (f.f_code, f.f_lineno) if f is not None else None
        stack = self._stacks.get(key)
        if stack is None:
            stack = self._stacks[key] = tuple(instrument.user_stack(frame=f)) if f is not None else ()
        return stack

    def _on_call(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self.forwards += 1
        outs = [t for t in _tensors(output) if t.grad_fn is not None]
        if not outs:
            return
        self.recorded += 1
        stack = self._stack()
        site = self._calls.get(stack)
        if site is None:
            site = self._calls[stack] = [0, 0]
        site[0] += 1
        seen = [False]

        def hook(grad: torch.Tensor) -> None:
            if not seen[0]:
                seen[0] = True
                site[1] += 1

        for t in outs:
            t.register_hook(hook)

    def _install(self, stack: ExitStack) -> None:
        CALLS.subscribe(stack, top_post=self._on_call)

    def sample(self) -> dict:
        """Top-level forwards, those that recorded a graph, and those whose graph no backward used."""
        discarded = instrument.discarded_grad_mode_sites()
        unused = explained = 0
        for stack, (recorded, used) in self._calls.items():
            if recorded > used:
                unused += recorded - used
                files = {path for path, _ in stack}
                causes = [[path, line] for path, line in discarded if path in files]
                if not causes:  # an evaluation without no_grad at all: wasteful, but not this rule's defect
                    continue
                explained += recorded - used
                what = ("forward recorded an autograd graph that no backward used, after a no_grad()/"
                        "inference_mode() built and never entered (line " +
                        ", ".join(str(line) for _, line in causes) + ")")
                self.attribute("TGL103", what, amount=recorded - used, stack=merge_stacks(causes, stack))
        return {"forwards": self.forwards, "recorded": self.recorded, "unused": explained, "unused_any": unused,
                "discarded_switches": len(discarded)}

    @classmethod
    def decide(cls, samples: dict[int, dict]) -> Measurement:
        """Defect iff a run has >= 1 forward whose graph no backward used."""
        s = samples[min(samples)]
        defect = any(v["unused"] >= 1 for v in samples.values())
        return Measurement(cls.name, float(s["unused"]), cls.unit,
                           f"forwards with an unused graph: {s['unused']}/{s['forwards']}",
                           cls.threshold, defect, {"runs": {str(k): v for k, v in samples.items()}})


# --------------------------------------------------------------------------------------------------
# TGL203: evaluation predictions that vary
# --------------------------------------------------------------------------------------------------


def _arg(args: tuple, kwargs: dict, pos: int, names: tuple[str, ...], default: Any) -> Any:
    for name in names:
        if name in kwargs:
            return kwargs[name]
    return args[pos] if len(args) > pos else default


def random_in_eval(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether a torch function call drops values at random: a dropout variant (``torch.dropout``,
    ``F.dropout2d``, ...) with ``p > 0`` and training on, or SDPA with ``dropout_p > 0``."""
    name = getattr(func, "__name__", "")
    try:
        if name == "scaled_dot_product_attention":
            return float(_arg(args, kwargs, 4, ("dropout_p",), 0.0)) > 0
        if "dropout" in name:
            return float(_arg(args, kwargs, 1, ("p",), 0.5)) > 0 and \
                bool(_arg(args, kwargs, 2, ("training", "train"), True))
    except (TypeError, ValueError):  # a tensor p, an odd signature: not judged
        return False
    return False


def _autocast_state() -> tuple:
    """``((device_type, dtype), ...)`` of the autocast regions active now (CPU, and CUDA when present)."""
    out = []
    for device_type in ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",):
        if torch.is_autocast_enabled(device_type):
            out.append((device_type, torch.get_autocast_dtype(device_type)))
    return tuple(out)


class _RandomCalls(TorchFunctionMode):
    """Records the user's call stack of every call that :func:`random_in_eval` flags (results unchanged)."""

    def __init__(self) -> None:
        super().__init__()
        self.stacks: list[tuple] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        if random_in_eval(func, args, kwargs):
            self.stacks.append(tuple(instrument.user_stack(frame=sys._getframe(1))))
        return func(*args, **kwargs)


class EvalSpreadProbe(Probe):
    """Spread of repeated eval-mode predictions of the models the program ran.

    A global forward hook remembers every top-level module and the inputs of
    its last call. After the run each such module is put in eval mode
    (:meth:`torch.nn.Module.eval`) and called :attr:`REPEATS` times on those
    inputs under ``torch.no_grad()``; its mode is restored afterwards. In eval
    mode a forward is deterministic (dropout is off, batch norm uses its running
    statistics), so the element-wise standard deviation over the repeats is 0;
    dropout that ignores the module's mode makes it > 0.

    While repeating, a :class:`torch.overrides.TorchFunctionMode` notes the user's line
    of every dropout call with ``p > 0`` and training on (``F.dropout(h, p)``,
    ``torch.dropout(h, p, True)``, SDPA ``dropout_p > 0``): the dropout that ignores the
    mode, and the finding's line. A module whose repeats vary without such a call (one
    that builds a fresh layer in each forward) is listed apart and not counted.
    Figure: the largest, over modules with such a call, mean element-wise std of the
    repeated predictions (output units). Threshold: defect when > 1e-6 (repeats of one
    deterministic CPU computation are bit-identical; 1e-6 leaves room for
    nondeterministic GPU kernels).
    """

    name = "eval-spread"
    unit = "std"
    threshold = ("mean std of 8 repeated eval-mode predictions on the same input > 1e-6, with a dropout call "
                 "active in them")
    REPEATS = 8
    TOLERANCE = 1e-6

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[int, tuple[torch.nn.Module, tuple]] = {}

    def _on_call(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if not isinstance(args, tuple) or not any(isinstance(a, torch.Tensor) for a in args):
            return
        kept = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
        self._last[id(module)] = (module, kept, _autocast_state())

    def _install(self, stack: ExitStack) -> None:
        CALLS.subscribe(stack, top_post=self._on_call)

    def _spread(self, module: torch.nn.Module, args: tuple, calls: _RandomCalls,
                autocast: tuple = ()) -> Optional[float]:
        """Mean std of :attr:`REPEATS` eval-mode predictions, under the autocast the last call ran in;
        ``None`` when a repeat raises (not judged)."""
        was_training = module.training
        module.eval()
        try:
            with torch.no_grad(), ExitStack() as amp:
                for device_type, dtype in autocast:
                    amp.enter_context(torch.autocast(device_type=device_type, dtype=dtype))
                outs = []
                for _ in range(self.REPEATS):
                    with calls:
                        out = next(iter(_tensors(module(*args))), None)
                    if out is None or not out.is_floating_point():
                        return 0.0
                    outs.append(out.detach().double())
            return float(torch.stack(outs).std(dim=0).mean())
        except Exception:  # noqa: BLE001 - the re-run of the user's model failed: nothing measured
            return None
        finally:
            module.train(was_training)

    def sample(self) -> dict:
        """Per top-level module class: the mean std of its repeated eval predictions (float64)."""
        spreads: dict[str, float] = {}
        other: dict[str, float] = {}
        failed: list[str] = []
        for module, args, autocast in self._last.values():
            key = type(module).__name__
            calls = _RandomCalls()
            spread = self._spread(module, args, calls, autocast)
            if spread is None:
                failed.append(key)
                continue
            if not calls.stacks:  # varies for another reason (a module built anew in each forward): not dropout
                other[key] = max(other.get(key, 0.0), spread)
                continue
            spreads[key] = max(spreads.get(key, 0.0), spread)
            if spread > self.TOLERANCE:
                what = f"{key} in eval mode: prediction std {spread:.3g} over {self.REPEATS} repeats"
                for stack in dict.fromkeys(calls.stacks):
                    self.attribute("TGL203", what, amount=calls.stacks.count(stack) / self.REPEATS, stack=stack,
                                   unit="dropout calls/forward")
        self._last.clear()
        return {"spreads": spreads, "max_spread": max(spreads.values(), default=0.0), "other_spreads": other,
                "rerun_failed": failed}

    @classmethod
    def decide(cls, samples: dict[int, dict]) -> Measurement:
        """Defect iff a run's largest spread exceeds :attr:`TOLERANCE`."""
        s = samples[min(samples)]
        defect = any(v["max_spread"] > cls.TOLERANCE for v in samples.values())
        return Measurement(cls.name, float(s["max_spread"]), cls.unit,
                           f"eval prediction std: {s['max_spread']:.4g}", cls.threshold, defect,
                           {"runs": {str(k): v for k, v in samples.items()}})


# --------------------------------------------------------------------------------------------------
# TGL006 / TGL007: gradients no optimizer applies
# --------------------------------------------------------------------------------------------------


class UnoptimizedGradientProbe(Probe):
    """Leaf tensors that receive gradients but belong to no optimizer that steps.

    A wrapper around ``torch.autograd.backward`` (which ``Tensor.backward``
    calls) walks each backward's graph from its roots and collects the leaf
    tensors it will accumulate into (the ``variable`` of every
    ``AccumulateGrad`` node). Global optimizer step pre-hooks
    (:func:`torch.optim.optimizer.register_optimizer_step_pre_hook`) collect
    the parameters of every optimizer that steps. A leaf in the first set and
    not in the second gets gradients that no optimizer applies: a layer kept in
    a plain list, a ``requires_grad=True`` tensor instead of an
    ``nn.Parameter``, a layer built anew inside ``forward``.

    Attribution, per such leaf: TGL006 at the user's line that stored it, or the
    modules holding it, on a module in a plain list, tuple or dict or as a plain
    tensor attribute (a wrapper around ``nn.Module.__setattr__``: ``self.hidden =
    [...]``, ``self.temperature = torch.zeros(1, requires_grad=True)``), or the
    leaf a plain tensor attribute was computed from (``self.scale =
    nn.Parameter(t).double()`` holds a non-leaf copy); else TGL007
    at the line that built its module while a module's forward ran (a global
    parameter registration hook: ``nn.Linear(...)(h)`` in ``forward``).

    Only those leaves count, and only when an optimizer stepped: a registered module's
    parameters left out of the optimizer (fine-tuning part of a model) and a plain
    tensor no module holds (an input with ``requires_grad``, a gradient check's inputs)
    are listed apart (``plain_leaves``).

    Figure: the most such leaf tensors one backward reached (count), in the run at
    N; their element count is in the details. Threshold: defect when >= 1 (when
    optimizers are built from ``model.parameters()``, every tensor that receives a
    gradient is in one). A parameter an optimizer holds stays alive, so its id
    identifies it for the whole run.
    """

    name = "unoptimized-grads"
    unit = "tensors"
    threshold = (">= 1 tensor held by a plain list/tuple/dict/tensor module attribute, or parameter of a module built "
                 "during a forward, received a gradient but is in no parameter group of an optimizer that stepped")

    def __init__(self) -> None:
        super().__init__()
        # distinct leaf sets of the backwards: id of each leaf reached -> (numel, where it came from)
        self._graphs: dict[frozenset, dict[int, tuple]] = {}
        self._optimized: set[int] = set()
        self._created: dict[int, tuple] = {}  # id(param) -> (weakref, stack, built during a forward)
        self._holders: dict[tuple, tuple] = {}  # (id(module), attribute) -> (module weakref, attribute, stack)
        self._held: Optional[dict[int, tuple]] = None  # id(tensor) -> (attribute, stack), from _holders
        self._where: dict[int, tuple] = {}  # id(leaf) -> (weakref, site)
        self.backwards = 0
        self.optimizer_steps = 0

    def on_backward_begin(self, kind: str, roots: tuple, retain: bool, create_graph: bool) -> None:
        if kind == "backward":
            self.backwards += 1
            self._collect(roots)

    def _collect(self, roots: Any) -> None:
        if isinstance(roots, torch.Tensor):
            roots = (roots,)
        leaves: dict[int, tuple] = {}
        for var in graph_leaves(roots):
            key = id(var)
            leaves[key] = (var.numel(), "optimized" if key in self._optimized else self._site(var))
        self._graphs.setdefault(frozenset(leaves.items()), leaves)

    # attribution -------------------------------------------------------------------------------
    def _site(self, leaf: torch.Tensor) -> Optional[tuple]:
        """``(code, what, stack)`` of where a leaf came from (cached while the leaf lives); ``None`` for a
        leaf neither a module built nor a module attribute holds."""
        cached = self._where.get(id(leaf))
        if cached is not None and cached[0]() is leaf:
            return cached[1]
        if self._held is None:
            self._held = self._index_holders()
        held = self._held.get(id(leaf))
        created = self._created.get(id(leaf))
        if created is not None and created[0]() is not leaf:
            created = None
        if held is not None:
            name, kind, stack = held
            site = ("TGL006", f"held in `{name}`, a plain {kind} attribute the module does not register", stack)
        elif created is not None and created[2]:
            site = ("TGL007", "parameters of a module built during a forward", created[1])
        else:  # a registered module left out of the optimizer (fine-tuning part of a model), an input with
            site = None  # requires_grad (gradcheck inputs, an adversarial perturbation): not counted
        try:
            self._where[id(leaf)] = (weakref.ref(leaf), site)
        except TypeError:  # pragma: no cover - a tensor without weak references
            pass
        return site

    def _index_holders(self) -> dict[int, tuple]:
        out: dict[int, tuple] = {}
        for mref, name, stack in self._holders.values():
            module = mref()
            value = module.__dict__.get(name) if module is not None else None
            items = list(value.values()) if isinstance(value, dict) else \
                list(value) if isinstance(value, (list, tuple)) else [value]
            kind = type(value).__name__ if isinstance(value, (list, tuple, dict)) else "tensor"
            for item in items:
                tensors = item.parameters() if isinstance(item, torch.nn.Module) else \
                    [item] if isinstance(item, torch.Tensor) else []
                for t in tensors:
                    out.setdefault(id(t), (name, kind, stack))
                    # ``nn.Parameter(t).to(device)`` / ``.double()``: the attribute holds a non-leaf
                    # copy; the gradient reaches the leaf it was made from, which nothing registers
                    for leaf in graph_leaves((t,)) if t.grad_fn is not None else ():
                        out.setdefault(id(leaf), (name, kind, stack))
        return out

    def _on_parameter(self, module: torch.nn.Module, name: str, param: Any) -> None:
        if isinstance(param, torch.Tensor):
            in_forward = instrument.outermost_module_call() is not None
            try:
                self._created[id(param)] = (weakref.ref(param), tuple(instrument.user_stack()), in_forward)
            except TypeError:  # pragma: no cover
                pass
        return None

    def _on_setattr(self, module: torch.nn.Module, name: str, value: Any, caller: Any) -> None:
        if isinstance(value, (list, tuple, dict)) or (
                isinstance(value, torch.Tensor) and value.requires_grad and not isinstance(value, torch.nn.Parameter)):
            if instrument.is_user_file(caller.f_code.co_filename):
                self._holders[(id(module), name)] = (weakref.ref(module), name,
                                                     tuple(instrument.user_stack(frame=caller)))
                self._held = None

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.optimizer_steps += 1
        for group in optimizer.param_groups:
            for p in group["params"]:
                self._optimized.add(id(p))

    def _install(self, stack: ExitStack) -> None:
        from torch.nn.modules.module import register_module_parameter_registration_hook
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        probe = self
        module_setattr = torch.nn.Module.__setattr__

        def setattr_(module: torch.nn.Module, name: str, value: Any) -> None:
            module_setattr(module, name, value)
            probe._on_setattr(module, name, value, sys._getframe(1))

        torch.nn.Module.__setattr__ = setattr_  # type: ignore[method-assign]
        stack.callback(setattr, torch.nn.Module, "__setattr__", module_setattr)
        stack.callback(register_module_parameter_registration_hook(self._on_parameter).remove)
        stack.callback(register_optimizer_step_pre_hook(self._pre_step).remove)

    def sample(self) -> dict:
        """Over the run's backwards, the most leaves one backward reached that no stepping
        optimizer holds (and their element count), and the most leaves one backward reached.
        Per backward, so that the figures do not depend on tensor ids being reused."""
        worst, elements, graded, worst_missing, plain = 0, 0, 0, [], 0
        for leaves in self._graphs.values():
            missing = [(n, site) for key, (n, site) in leaves.items()
                       if key not in self._optimized and site not in (None, "optimized")]
            plain = max(plain, sum(1 for key, (_, site) in leaves.items()
                                   if key not in self._optimized and site is None))
            size = sum(n for n, _ in missing)
            graded = max(graded, len(leaves))
            if (len(missing), size) > (worst, elements):
                worst, elements, worst_missing = len(missing), size, missing
        if not self.optimizer_steps:  # no optimizer steps at all (a gradient check, saliency): nothing to miss
            worst, elements, worst_missing = 0, 0, []
        for n, (code, what, where) in worst_missing:
            rec = self.attribute(code, f"{what}: gradients no optimizer applies", stack=where, unit="leaf tensors")
            rec["elements"] = rec.get("elements", 0) + n
        return {"plain_leaves": plain, "graded_leaves": graded, "unoptimized": worst, "unoptimized_elements": elements,
                "backwards": self.backwards, "optimizer_steps": self.optimizer_steps}

    @classmethod
    def decide(cls, samples: dict[int, dict]) -> Measurement:
        """Defect iff a run has >= 1 graded leaf outside every stepping optimizer."""
        s = samples[min(samples)]
        defect = any(v["unoptimized"] >= 1 for v in samples.values())
        return Measurement(cls.name, float(s["unoptimized"]), cls.unit,
                           f"leaves per backward with gradients no optimizer applies: "
                           f"{s['unoptimized']}/{s['graded_leaves']} ({s['unoptimized_elements']} elements)",
                           cls.threshold, defect, {"runs": {str(k): v for k, v in samples.items()}})


STRUCTURE_PROBES: dict[str, type[Probe]] = {p.name: p for p in
                                            (UnusedGraphProbe, EvalSpreadProbe, UnoptimizedGradientProbe)}
