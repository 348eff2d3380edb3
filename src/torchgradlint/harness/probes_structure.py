"""Probes for the rules about model structure and evaluation behaviour.

=================  ===========  ==========================================================
probe              rules        defect when
=================  ===========  ==========================================================
unused-graph       TGL103       >= 1 top-level module forward recorded an autograd graph
                                that no backward ever used
eval-spread        TGL203       the mean std of repeated eval-mode predictions of a model
                                the program ran is > 1e-6 (eval forwards must be
                                deterministic)
unoptimized-grads  TGL006,      >= 1 leaf tensor received a gradient from a backward but is
                   TGL007       in no parameter group of any optimizer that stepped
=================  ===========  ==========================================================

Each probe observes the fixture from outside (global module hooks, optimizer
step hooks, a wrapper around ``torch.autograd.backward``), like those of
:mod:`.probes`.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any, Iterator

import torch

from .probes import Measurement, Probe


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


class _TopLevelCalls:
    """Global forward pre-hook / hook pair that tells top-level module calls
    (not made inside another module's forward) from nested ones."""

    def __init__(self, on_top_level) -> None:
        self.depth = 0
        self.on_top_level = on_top_level

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        self.depth += 1
        return None

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self.depth = max(0, self.depth - 1)
        if self.depth == 0:
            self.on_top_level(module, args, output)
        return None

    def install(self, stack: ExitStack) -> None:
        """Register both hooks; push their removal onto ``stack``."""
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        stack.callback(register_module_forward_pre_hook(self._pre).remove)
        stack.callback(register_module_forward_hook(self._post).remove)


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

    Figure: such forwards (count) in the run at N, out of all top-level forwards.
    Threshold: defect when >= 1 (a training forward is always backpropagated;
    an evaluation forward under ``no_grad``/``inference_mode`` records no graph).
    """

    name = "unused-graph"
    rules = ("TGL103",)
    unit = "forwards"
    threshold = ">= 1 top-level module forward recorded an autograd graph that no backward used"

    def __init__(self) -> None:
        super().__init__()
        self.forwards = 0
        self.recorded = 0
        self._used: list[bool] = []

    def _on_call(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self.forwards += 1
        outs = [t for t in _tensors(output) if t.grad_fn is not None]
        if not outs:
            return
        self.recorded += 1
        index = len(self._used)
        self._used.append(False)

        def hook(grad: torch.Tensor) -> None:
            self._used[index] = True

        for t in outs:
            t.register_hook(hook)

    def _install(self, stack: ExitStack) -> None:
        _TopLevelCalls(self._on_call).install(stack)

    def sample(self) -> dict:
        """Top-level forwards, those that recorded a graph, and those whose graph no backward used."""
        return {"forwards": self.forwards, "recorded": self.recorded,
                "unused": sum(1 for u in self._used if not u)}

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


class EvalSpreadProbe(Probe):
    """Spread of repeated eval-mode predictions of the models the program ran.

    A global forward hook remembers every top-level module and the inputs of
    its last call. After the run each such module is put in eval mode
    (:meth:`torch.nn.Module.eval`) and called :attr:`REPEATS` times on those
    inputs under ``torch.no_grad()``; its mode is restored afterwards. In eval
    mode a forward is deterministic (dropout is off, batch norm uses its running
    statistics), so the element-wise standard deviation over the repeats is 0;
    dropout that ignores the module's mode makes it > 0.

    Figure: the largest, over modules, mean element-wise std of the repeated
    predictions (output units). Threshold: defect when > 1e-6 (repeats of one
    deterministic CPU computation are bit-identical; 1e-6 leaves room for
    nondeterministic GPU kernels).
    """

    name = "eval-spread"
    rules = ("TGL203",)
    unit = "std"
    threshold = "mean std of 8 repeated eval-mode predictions on the same input > 1e-6"
    REPEATS = 8
    TOLERANCE = 1e-6

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[int, tuple[torch.nn.Module, tuple]] = {}

    def _on_call(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if not isinstance(args, tuple) or not any(isinstance(a, torch.Tensor) for a in args):
            return
        kept = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
        self._last[id(module)] = (module, kept)

    def _install(self, stack: ExitStack) -> None:
        _TopLevelCalls(self._on_call).install(stack)

    def _spread(self, module: torch.nn.Module, args: tuple) -> float:
        was_training = module.training
        module.eval()
        try:
            with torch.no_grad():
                outs = []
                for _ in range(self.REPEATS):
                    out = next(iter(_tensors(module(*args))), None)
                    if out is None or not out.is_floating_point():
                        return 0.0
                    outs.append(out.detach().double())
            return float(torch.stack(outs).std(dim=0).mean())
        finally:
            module.train(was_training)

    def sample(self) -> dict:
        """Per top-level module class: the mean std of its repeated eval predictions (float64)."""
        spreads: dict[str, float] = {}
        for module, args in self._last.values():
            key = type(module).__name__
            spreads[key] = max(spreads.get(key, 0.0), self._spread(module, args))
        self._last.clear()
        return {"spreads": spreads, "max_spread": max(spreads.values(), default=0.0)}

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

    Figure: the most such leaf tensors one backward reached (count), in the run at
    N; their element count is in the details. Threshold: defect when >= 1 (when
    optimizers are built from ``model.parameters()``, every tensor that receives a
    gradient is in one). A parameter an optimizer holds stays alive, so its id
    identifies it for the whole run.
    """

    name = "unoptimized-grads"
    rules = ("TGL006", "TGL007")
    unit = "tensors"
    threshold = ">= 1 leaf tensor received a gradient but is in no parameter group of an optimizer that stepped"

    def __init__(self) -> None:
        super().__init__()
        self._graphs: list[dict[int, int]] = []  # per backward: id of each leaf it reaches -> numel
        self._optimized: set[int] = set()
        self.backwards = 0
        self.optimizer_steps = 0

    def _collect(self, roots: Any) -> None:
        if isinstance(roots, torch.Tensor):
            roots = (roots,)
        stack = [t.grad_fn for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        seen: set[int] = set()
        leaves: dict[int, int] = {}
        self._graphs.append(leaves)
        while stack:
            fn = stack.pop()
            if id(fn) in seen:
                continue
            seen.add(id(fn))
            var = getattr(fn, "variable", None)
            if isinstance(var, torch.Tensor):
                leaves[id(var)] = var.numel()
            for nxt, _ in getattr(fn, "next_functions", ()):
                if nxt is not None and id(nxt) not in seen:
                    stack.append(nxt)

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.optimizer_steps += 1
        for group in optimizer.param_groups:
            for p in group["params"]:
                self._optimized.add(id(p))

    def _install(self, stack: ExitStack) -> None:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        inner = torch.autograd.backward

        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            self.backwards += 1
            self._collect(tensors)
            return inner(tensors, *args, **kwargs)

        torch.autograd.backward = backward

        def restore() -> None:
            torch.autograd.backward = inner

        stack.callback(restore)
        stack.callback(register_optimizer_step_pre_hook(self._pre_step).remove)

    def sample(self) -> dict:
        """Over the run's backwards, the most leaves one backward reached that no stepping
        optimizer holds (and their element count), and the most leaves one backward reached.
        Per backward, so that the figures do not depend on tensor ids being reused."""
        worst, elements, graded = 0, 0, 0
        for leaves in self._graphs:
            missing = [n for key, n in leaves.items() if key not in self._optimized]
            graded = max(graded, len(leaves))
            if (len(missing), sum(missing)) > (worst, elements):
                worst, elements = len(missing), sum(missing)
        return {"graded_leaves": graded, "unoptimized": worst, "unoptimized_elements": elements,
                "backwards": self.backwards, "optimizer_steps": self.optimizer_steps}

    @classmethod
    def decide(cls, samples: dict[int, dict]) -> Measurement:
        """Defect iff a run has >= 1 graded leaf outside every stepping optimizer."""
        s = samples[min(samples)]
        defect = any(v["unoptimized"] >= 1 for v in samples.values())
        return Measurement(cls.name, float(s["unoptimized"]), cls.unit,
                           f"leaves per backward with gradients no optimizer applies: {s['unoptimized']}/{s['graded_leaves']} "
                           f"({s['unoptimized_elements']} elements)",
                           cls.threshold, defect, {"runs": {str(k): v for k, v in samples.items()}})


STRUCTURE_PROBES: dict[str, type[Probe]] = {p.name: p for p in
                                            (UnusedGraphProbe, EvalSpreadProbe, UnoptimizedGradientProbe)}
