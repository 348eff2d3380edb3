"""Training-step facts: backward calls, optimizer steps, gradient resets.

PyTorch docs: ``torch.Tensor.backward``, ``torch.autograd.backward``,
``torch.autograd.grad``, ``torch.optim.Optimizer.step`` / ``zero_grad``,
``torch.amp.GradScaler``; HF accelerate ``Accelerator.backward``, Lightning
``Fabric.backward`` and ``LightningModule.manual_backward``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import libcst as cst

from ..cells import FOREIGN_FRAMEWORKS
from .literals import is_literal
from .model import RECEIVER_METHODS, Assign, Call, FileModel, Loop, Scope, names_in, unwrap
from .names import dotted_name

# Receivers whose ``.backward(loss)`` backpropagates its argument.
_ENGINE_RECEIVER = re.compile(r"(^|[._])(accelerator|accel|fabric|engine|model_engine|trainer)$", re.I)
_OPTIMIZER_TOKEN = re.compile(r"^(opt|optim|optimi[sz]er)[a-z]?\d*s?$")
_SCHEDULER_HINT = re.compile(r"sched|lr|warmup|swa", re.I)
_RESET_NAME = re.compile(r"(zero|reset|clear|set_to_none)_?(the_)?(grad|grads|gradients)$", re.I)
_GRAD_RESET_METHODS = frozenset({"zero_", "fill_", "detach_", "requires_grad_"})


@dataclass(frozen=True)
class Backward:
    """A call that runs backward.

    ``target`` is the tensor expression backpropagated; ``accumulates`` is
    ``False`` for ``torch.autograd.grad`` (it returns gradients instead of
    adding into ``.grad``).
    """

    call: Call
    target: Optional[cst.BaseExpression]
    accumulates: bool

    @property
    def retain_graph(self) -> Optional[cst.BaseExpression]:
        """The ``retain_graph=`` argument, if given."""
        return self.call.keyword("retain_graph")

    @property
    def create_graph(self) -> Optional[cst.BaseExpression]:
        """The ``create_graph=`` argument, if given."""
        return self.call.keyword("create_graph")


@dataclass(frozen=True)
class OptimizerStep:
    """An optimizer step: ``opt.step()``, ``opt.step(closure)``,
    ``scaler.step(opt)``, ``xm.optimizer_step(opt)``.

    ``optimizer`` is the dotted text of the optimizer when known.
    """

    call: Call
    optimizer: Optional[str]
    closure: Optional[cst.BaseExpression]


def backward_call(model: FileModel, call: Call) -> Optional[Backward]:
    """The :class:`Backward` this call performs, or ``None``."""
    qn = call.qualname
    if qn == "torch.autograd.grad":
        return Backward(call, call.arg(0, "outputs"), accumulates=False)
    if qn == "torch.autograd.backward":
        return Backward(call, call.arg(0, "tensors"), accumulates=True)
    if qn == "torch.distributed.autograd.backward":
        # ``dist_autograd.backward(context_id, roots)``: gradients go into the
        # distributed autograd context, never into ``.grad``.
        return Backward(call, call.arg(1, "roots"), accumulates=False)
    if call.method == "manual_backward" and call.receiver is not None:
        return Backward(call, call.arg(0), accumulates=True)
    if call.method != "backward" or call.receiver is None:
        return None
    if _hand_written_backward(model, call):
        return None
    recv = call.receiver_text
    if recv is not None and _ENGINE_RECEIVER.search(recv) and call.arg(0) is not None:
        return Backward(call, call.arg(0, "loss"), accumulates=True)
    if recv is not None and model.names.qualify(recv) in ("torch", "torch.autograd", "torch.distributed.autograd"):
        return None
    return Backward(call, call.receiver, accumulates=True)


def differentiable_step(model: FileModel, call: Call) -> Optional[Backward]:
    """``diffopt.step(loss)`` of an object named like an optimizer, given a
    computed value rather than a closure: a differentiable optimizer (the
    ``higher`` library's ``innerloop_ctx``, a wrapper that runs the backward
    itself) that takes the gradients of ``loss`` and hands them to the
    update instead of adding them into ``.grad`` (torch's own ``step`` takes
    a closure, not a tensor). Not a :func:`backward_call`: it consumes
    ``loss``'s graph (what TGL101 asks) but leaves ``.grad`` alone."""
    if call.method != "step" or call.receiver is None:
        return None
    loss = call.arg(0, "loss")
    if loss is None or not is_optimizer(model, call.receiver_text) or _may_be_callable(model, loss, call):
        return None
    return Backward(call, loss, accumulates=False)


def _hand_written_backward(model: FileModel, call: Call) -> bool:
    """``model.backward(x, yhat, y)``: the backward pass of a from-scratch
    model (a course's hand-written gradients), not ``Tensor.backward``. A
    class of the file that is not an ``autograd.Function`` must define
    ``backward(self, ...)``, and either the receiver is a name every binding
    of which that reaches the call (else in the file) constructs such a
    class (``my_fit = my_composition([...])`` ...
    ``my_fit.backward()``), or the call passes three or more positional
    arguments that method takes (the third of ``Tensor.backward(gradient,
    retain_graph, create_graph, inputs)`` would be ``create_graph``, which
    nobody passes by position). In a file that never spells ``torch`` and
    star-imports nothing, any ``x.backward(grad)`` given an argument is one
    (``layers[i].backward(grad)`` over a course's numpy layers imported from
    other files): ``Tensor.backward``'s explicit gradient is a tensor the
    file would have to make with torch."""
    if any(a.keyword is None and not a.star for a in call.node.args) and "torch" not in model.source \
            and not model.names.star_modules and not _ENGINE_RECEIVER.search(call.receiver_text or ""):
        return True  # (``accelerator.backward(loss)`` runs the loss's backward)
    classes = model.cached("hand_written_backward", lambda: {
        name: len(info.methods["backward"].params) - 1 for name, info in model.classes.items()
        if "backward" in info.methods and not any(b.endswith("Function") for b in info.bases)
        and info.methods["backward"].params[:1] == ["self"]
        and not _delegates_to_autograd(model, info.methods["backward"])})
    if not classes:
        return False
    recv = call.receiver_text
    if recv and "." not in recv:
        # the bindings that reach the call (a notebook may rebind ``net`` to a torch model later)
        bindings = model.reaching_bindings(recv, call) or [a for a in model.assigns if a.binds(recv)]
        if bindings and all(a.kind in ("assign", "annassign") and not a.unpacked and isinstance(a.value, cst.Call)
                            and dotted_name(a.value.func) in classes for a in bindings):
            return True  # ``layer = add_bias(1)`` ... ``layer.backward(grad)``: an instance of such a class
    positional = sum(1 for a in call.node.args if a.keyword is None and not a.star)
    return positional >= 3 and any(n >= positional for n in classes.values())


def _delegates_to_autograd(model: FileModel, method: Scope) -> bool:
    """Whether a ``backward(self, loss)`` method hands its argument to
    autograd (``loss.backward()``, ``self.scaler.scale(loss).backward()``,
    ``torch.autograd.backward(loss)``): a wrapper such as an accelerate-style
    ``Accelerator``, not hand-written gradients (``layer.backward(grad)`` on
    the layers it holds is hand-written)."""
    params = set(method.params[1:])
    for c in model.calls_in_scope(method):
        if (c.qualname or "").startswith("torch.autograd."):
            return True
        if c.method in ("backward", "manual_backward") and names_in(c.node) & params:
            return True
    return False


def optimizer_constructors(model: FileModel) -> dict[str, Assign]:
    """Names and attributes bound to ``torch.optim.<Optimizer>(...)`` calls
    (learning-rate schedulers excluded), mapped to their binding.
    Computed once per file (cached in ``model.memo``)."""
    cached = model.memo.get("optimizer_constructors")
    if cached is not None:
        return cached  # type: ignore[return-value]
    found: dict[str, Assign] = {}
    model.memo["optimizer_constructors"] = found
    for a in model.assigns:
        if _optimizer_binding(model, a):
            for t in a.targets:
                if t.text:
                    found[t.text] = a
    return found


def _optimizer_binding(model: FileModel, a: Assign) -> bool:
    """Whether ``a`` binds a ``torch.optim.<Optimizer>(...)`` call (not a
    learning-rate scheduler or an SWA utility)."""
    if a.kind != "assign" or not isinstance(a.value, cst.Call) or a.unpacked:
        return False
    qn = model.qualname(a.value.func) or ""
    return qn.startswith("torch.optim.") and ".lr_scheduler" not in qn and ".swa_utils" not in qn


def _looks_like_optimizer(text: str) -> bool:
    last = text.rsplit(".", 1)[-1].lower()
    if _SCHEDULER_HINT.search(last):
        return False
    return any(_OPTIMIZER_TOKEN.match(tok) for tok in last.split("_") if tok)


def is_optimizer(model: FileModel, text: Optional[str]) -> bool:
    """Whether the dotted name ``text`` holds an optimizer: bound to a
    ``torch.optim`` constructor in this file, or named like one
    (``optimizer``, ``opt_g``, ``self.optim``) and not like a scheduler."""
    if not text:
        return False
    if text in optimizer_constructors(model):
        return True
    return _looks_like_optimizer(text)


def optimizer_step(model: FileModel, call: Call) -> Optional[OptimizerStep]:
    """The :class:`OptimizerStep` this call performs, or ``None``.

    ``scheduler.step()`` is not an optimizer step; neither is ``env.step(a)``.
    """
    if call.method == "optimizer_step":  # torch_xla: xm.optimizer_step(opt)
        opt = call.arg(0, "optimizer")
        return OptimizerStep(call, dotted_name(opt), None)
    if call.method != "step" or call.receiver is None:
        return None
    recv = call.receiver_text
    if recv is not None and "scaler" in recv.rsplit(".", 1)[-1].lower():
        opt = call.arg(0, "optimizer")
        return OptimizerStep(call, dotted_name(opt), None) if opt is not None else None
    if not is_optimizer(model, recv):
        return None
    callees = model.resolve_callee(call) or model.parameter_methods(call)
    if callees and all(_steps_without_gradients(model, s) for s in callees):
        return None  # ``ema_optimizer = WeightEMA(model, ema_model)``: a same-file class that reads no gradient
    closure = call.arg(0, "closure")
    if closure is not None and not _may_be_callable(model, closure, call):
        # ``optim.step(loss)``: a wrapper that runs the backward and the reset
        # itself (torch's ``step`` takes a closure, not a tensor)
        return None
    return OptimizerStep(call, recv, closure)


_GRADIENT_USE = re.compile(r"grad|\.step\(")


def _steps_without_gradients(model: FileModel, method: Scope) -> bool:
    """Whether the same-file method ``method`` (a ``step`` an object named like
    an optimizer resolves to) neither reads gradients nor steps anything: an EMA
    of the weights (MixMatch's ``WeightEMA.step``), not an optimizer."""
    return model.memoised(_steps_without_gradients, id(method),
                          lambda: _GRADIENT_USE.search(model.module.code_for_node(method.node)) is None)


def _may_be_callable(model: FileModel, node: cst.BaseExpression, at: Call) -> bool:
    """Whether an optimizer ``step`` argument may be a closure: a lambda, a
    function, ``partial(...)``, or a name not bound to a computed value."""
    if isinstance(node, (cst.BinaryOperation, cst.UnaryOperation, cst.Subscript, cst.Integer, cst.Float)):
        return False
    def partial_call(value: Optional[cst.BaseExpression]) -> bool:
        return isinstance(value, cst.Call) and (model.qualname(value.func) or "").endswith("partial")

    if isinstance(node, cst.Call):
        return partial_call(node)
    text = dotted_name(node)
    if text is None or model.functions.get(text):
        return True
    if any(b.kind == "augassign" for b in model.reaching_bindings(text, at)):
        return False  # ``loss += ...`` in a loop before the call: a sum of values, not a function
    binding = model.reaching_binding(text, at)
    return binding is None or binding.kind not in ("assign", "annassign") or isinstance(
        binding.value, (cst.Lambda, cst.Name, cst.Attribute)) or partial_call(binding.value)


@dataclass(frozen=True)
class GradReset:
    """Something that clears ``.grad``: ``X.zero_grad()``, ``p.grad = None``,
    ``p.grad.zero_()``, or a call to a helper that does one.

    ``target`` is the receiver of ``zero_grad`` when it is an optimizer (the
    reset then covers that optimizer's parameters only); ``None`` means the
    reset may cover any parameters (a module, a loop over parameters, a
    helper).
    """

    order: int
    target: Optional[str]
    fact: Optional[object] = None
    """The call or binding that resets (``None`` for a helper's inner reset)."""
    module: Optional[str] = None
    """For ``M.zero_grad()`` on a module: ``M`` (it resets M's parameters only)."""


def call_reset(model: FileModel, call: Call, _depth: int = 0) -> Optional[GradReset]:
    """The :class:`GradReset` a call performs, directly or through a
    same-file helper (followed up to 3 calls deep)."""
    if call.method == "zero_grad":
        recv = call.receiver_text
        target = recv if recv and is_optimizer(model, recv) else None
        module = recv if recv and target is None and recv not in ("self",) else None
        return GradReset(call.order, target, call, module)
    if call.method and _RESET_NAME.search(call.method):
        return GradReset(call.order, None, call)
    recv = call.receiver_text or ""
    if call.method in _GRAD_RESET_METHODS and (recv.endswith(".grad") or recv.endswith(".grad.data")):
        return GradReset(call.order, None, call)
    if call.qualname in ("torch.nn.init.zeros_",) and "grad" in (dotted_name(call.arg(0)) or ""):
        return GradReset(call.order, None, call)
    if _depth < 3:
        for scope in model.resolve_callee(call):
            if function_resets(model, scope, _depth + 1):
                return GradReset(call.order, None, call)
    return None


def assign_reset(assign: Assign) -> Optional[GradReset]:
    """``p.grad = ...`` (``None`` or a fresh tensor) overwrites the gradient; so does
    ``p._grad = ...``, the same slot (A3C workers write ``shared_param._grad``)."""
    for t in assign.targets:
        if t.kind == "attr" and t.text and t.text.endswith((".grad", "._grad")) \
                and assign.kind in ("assign", "annassign"):
            return GradReset(assign.order, None, assign)
    return None


def function_resets(model: FileModel, scope: Scope, _depth: int = 0) -> bool:
    """Whether calling the function ``scope`` resets gradients."""
    span = (scope.order, scope.end)
    if any(call_reset(model, c, _depth) for c in model.calls_within(*span) if c.order != scope.order):
        return True
    return any(assign_reset(a) for a in model.assigns_within(*span))


def resets_within(model: FileModel, order: int, end: int) -> list[GradReset]:
    """Every gradient reset lexically inside ``[order, end]`` (nested defs
    such as LBFGS closures included) or reached through same-file helpers."""
    out = [r for c in model.calls_within(order, end) if (r := call_reset(model, c))]
    out += [r for a in model.assigns_within(order, end) if (r := assign_reset(a))]
    return sorted(out, key=lambda r: r.order)


def is_true(node: Optional[cst.BaseExpression]) -> bool:
    """Whether ``node`` is the literal ``True``."""
    return is_literal(node, True)




def foreign_framework_file(model: FileModel) -> bool:
    """Whether the file imports another deep-learning framework (MXNet,
    TensorFlow, JAX, Paddle...) and not torch: its ``backward``/``step``/
    ``no_grad`` calls follow that framework's semantics (MXNet overwrites
    gradients by default), so torch rules stay silent."""
    if model.names.imports_torch:
        return False
    return any(v.split(".")[0] in FOREIGN_FRAMEWORKS for v in model.names.aliases.values())


_PARAMETER_METHODS = frozenset({"parameters", "named_parameters"})


def optimizer_modules(model: FileModel, optimizer: Optional[str], at=None) -> Optional[frozenset[str]]:
    """Dotted names of the modules whose parameters the optimizer
    ``optimizer`` updates, read from its ``torch.optim`` constructor in this
    file (``Adam(list(E.parameters()) + list(G.parameters()))`` -> ``{E, G}``);
    ``None`` when the constructor or its parameters cannot be seen. ``at``:
    a fact where the optimizer is used, when known; the constructor bound
    there is read (a script that rebinds ``opt`` to the optimizer of each
    stage), else the file's last one."""
    if not optimizer:
        return None
    binding = optimizer_constructors(model).get(optimizer)
    here = model.reaching_binding(optimizer, at) if at is not None and binding is not None else None
    if here is not None and _optimizer_binding(model, here):
        binding = here
    if binding is None or not isinstance(binding.value, cst.Call):
        return None
    ctor = binding.value
    if ctor.args and ctor.args[0].keyword is None and isinstance(ctor.args[0].value, cst.Name):
        # ``ge_chain = chain(G.parameters(), E.parameters()); Adam(ge_chain, ...)``: the
        # parameters are bound to a name first (the latest binding before the constructor)
        params = model.reaching_binding(ctor.args[0].value.value, binding)
        if params is not None and params.kind in ("assign", "annassign") and params.value is not None:
            return _modules_in(model, params.value)
    return _constructor_modules(model, ctor)


def _constructor_modules(model: FileModel, ctor: cst.Call) -> Optional[frozenset[str]]:
    """The ``.parameters()`` receivers in an optimizer constructor's first argument."""
    if not ctor.args:
        return None
    return _modules_in(model, ctor.args[0].value)


def _modules_in(model: FileModel, expr: cst.BaseExpression) -> Optional[frozenset[str]]:
    """The receivers of the ``.parameters()``-like calls inside ``expr``."""
    from .tree import walk

    inside = {id(n) for n in walk(expr) if isinstance(n, cst.Call)}
    found = {c.receiver_text for c in model.calls
             if id(c.node) in inside and c.method in _PARAMETER_METHODS and c.receiver_text}
    return frozenset(found) or None


def configured_optimizer_modules(model: FileModel, optimizer: Optional[str], at: Call) -> Optional[frozenset[str]]:
    """For Lightning's ``opt_a, opt_b = self.optimizers()`` in a
    ``LightningModule`` method: the modules whose parameters the matching
    optimizer (same position) returned by the class's own
    ``configure_optimizers`` updates; ``None`` when the file does not show it."""
    if not optimizer:
        return None
    binding = model.reaching_binding(optimizer, at)
    if binding is None or not isinstance(binding.value, cst.Call) or dotted_name(binding.value.func) != "self.optimizers":
        return None
    target = binding.node.targets[0].target if isinstance(binding.node, cst.Assign) else None
    if not isinstance(target, (cst.Tuple, cst.List)):
        return None
    names = [dotted_name(e.value) for e in target.elements]
    fn = model.enclosing_function(at.scope)
    info = model.classes.get(fn.class_name or "") if fn is not None else None
    configure = info.methods.get("configure_optimizers") if info is not None else None
    if configure is None or optimizer not in names:
        return None
    index = names.index(optimizer)
    for ret in model.returns_of(configure):
        if not isinstance(ret.value, (cst.Tuple, cst.List)) or len(ret.value.elements) != len(names):
            continue
        element = ret.value.elements[index].value
        if isinstance(element, cst.Name):
            bound = model.reaching_binding(element.value, ret)
            element = bound.value if bound is not None else None
        if isinstance(element, cst.Call) and (model.qualname(element.func) or "").startswith("torch.optim."):
            return _constructor_modules(model, element)
    return None


def covers(modules: frozenset[str], callee: Optional[str]) -> bool:
    """Whether a forward through ``callee`` (``self.enc``, ``D``) uses
    parameters of one of ``modules`` (the module itself, a part of it, or a
    module it is part of)."""
    if not callee:
        return False
    return any(callee == m or callee.startswith(m + ".") or m.startswith(callee + ".") for m in modules)


def optimizer_owner(model: FileModel, optimizer: Optional[str], at=None) -> Optional[frozenset[str]]:
    """The modules an optimizer updates, when the file tells: its
    constructor's ``.parameters()`` receivers (the one bound at ``at``, when
    given), or the module that owns it as an attribute
    (``self.discriminator.optimizer`` -> ``self.discriminator``)."""
    modules = optimizer_modules(model, optimizer, at)
    if modules:
        return modules
    if optimizer and "." in optimizer:
        head, _, last = optimizer.rpartition(".")
        if _looks_like_optimizer(last) and head not in ("self", "cls"):
            return frozenset({head})
    return None


def reset_covers(model: FileModel, reset: GradReset, optimizer: Optional[str], at: Optional[Call] = None) -> bool:
    """Whether ``reset`` clears the gradients that the optimizer steps:
    a reset of unknown reach covers any; ``opt.zero_grad()`` covers ``opt``
    and the objects it holds or is held by (a learning-rate wrapper stepped as
    ``self.opt.step()`` and reset as ``self.opt.optimizer.zero_grad()``, the
    annotated Transformer's ``NoamOpt``), and another optimizer the file shows shares modules with it (two
    optimizers over ``self.layer.parameters()``, seen from the step ``at``);
    ``M.zero_grad()`` covers an optimizer unless the file shows that
    optimizer updates other modules."""
    if reset.target is None and reset.module is None:
        return True
    if reset.target is not None:
        if reset.target == optimizer:
            return True
        if optimizer and (reset.target.startswith(optimizer + ".") or optimizer.startswith(reset.target + ".")):
            return True  # a wrapper and the optimizer it holds: ``self.opt.step()``, ``self.opt.optimizer.zero_grad()``
        if at is None:
            return False
        mine = configured_optimizer_modules(model, optimizer, at) or optimizer_modules(model, optimizer)
        theirs = configured_optimizer_modules(model, reset.target, at) or optimizer_modules(model, reset.target)
        return bool(mine and theirs and any(covers(mine, m) for m in theirs))
    owner = optimizer_owner(model, optimizer, at)
    return owner is None or covers(owner, reset.module) or covers(owner, _bound_attribute(model, reset))


def _bound_attribute(model: FileModel, reset: GradReset) -> Optional[str]:
    """The attribute a reset module's name was bound from where the reset runs
    (``dynamic_net = run_manager.network`` ... ``dynamic_net.zero_grad()``:
    ``run_manager.network``, a part of the object that owns the optimizer)."""
    module = reset.module
    if not module or "." in module or not isinstance(reset.fact, Call):
        return None
    b = model.reaching_binding(module, reset.fact)
    if b is None or b.kind not in ("assign", "annassign") or b.unpacked or b.value is None:
        return None
    value = unwrap(b.value)
    return dotted_name(value) if isinstance(value, cst.Attribute) else None


# Methods that return their receiver (the same module or the same leaf
# tensor), so the result is only as new as the receiver.
_SAME_OBJECT_METHODS = RECEIVER_METHODS | {"to_empty", "type"}


def fresh_in_loop(model: FileModel, text: Optional[str], at, loop: "Loop | Scope", depth: int = 0) -> bool:
    """Whether ``text`` (an optimizer, a module or a leaf tensor) is a new
    object in every iteration of ``loop`` where ``at`` runs: bound inside
    the loop, before ``at``, by a call that builds a new object
    (``nn.Linear(...)``, ``x.detach().clone()``, ``build_model(cfg)``), and,
    for a ``torch.optim`` constructor, over parameters that are themselves
    new in the iteration (``SGD(model.parameters())`` with ``model`` built
    in the loop). Gradients of such objects start at ``None`` in every
    iteration, so nothing can go stale across iterations.

    A method that returns its receiver (``model.to(device)``) is as new as
    its receiver, and a wrapper call unpacked into several names
    (``model, opt = accelerator.prepare(model, opt)``) as new as what it
    wraps; an attribute (``self.model``) or a parameter is not new.
    ``at`` is the call or binding where ``text`` is read; ``loop`` may also
    be a function scope (new in every call of the function).
    """
    if not text or depth > 4:
        return False
    binding = model.reaching_binding(text, at)
    if binding is None or binding.kind not in ("assign", "annassign") \
            or not loop.contains(binding.order) or binding.order > at.order:
        return False
    if binding.unpacked:
        # ``model, optim = strategy.prepare(model=model, optim_wrapper=optim)``:
        # a wrapper over objects that are all new in this iteration.
        if not isinstance(binding.value, cst.Call):
            return False
        wrapped = [n for a in binding.value.args if (n := dotted_name(a.value)) and model.bindings_of(n, at.scope)]
        return bool(wrapped) and all(fresh_in_loop(model, n, binding, loop, depth + 1) for n in wrapped)
    return _fresh_value(model, text, binding.value, binding, loop, depth)


def _fresh_value(model: FileModel, text: str, value: Optional[cst.BaseExpression], at: Call, loop: "Loop | Scope",
                 depth: int) -> bool:
    """:func:`fresh_in_loop` for the expression ``value`` bound to ``text``."""
    if not isinstance(value, cst.Call):
        return False
    func = value.func
    if isinstance(func, cst.Attribute) and func.attr.value in _SAME_OBJECT_METHODS:
        receiver = func.value
        if isinstance(receiver, cst.Call):
            return _fresh_value(model, text, receiver, at, loop, depth + 1)
        return fresh_in_loop(model, dotted_name(receiver), at, loop, depth + 1)
    qn = model.qualname(func) or ""
    if qn.startswith("torch.optim.") or _looks_like_optimizer(text):
        params = value.args[0].value if value.args else None
        if params is None:
            return False
        # The longest names the scope binds (``self.gsm`` in ``self.gsm.parameters()``, not ``self``).
        bound = {n for n in names_in(params)
                 if any(b.kind != "param" for b in model.bindings_of(n, at.scope))}
        bound = [n for n in bound if not any(o != n and o.startswith(n + ".") for o in bound)]
        return bool(bound) and all(fresh_in_loop(model, r, at, loop, depth + 1) for r in bound)
    return True


def closure_functions(model: FileModel, closure: Optional[cst.BaseExpression], at: Call,
                      depth: int = 0) -> list[Scope]:
    """The same-file functions an optimizer-step closure runs: the function
    it names, or the one wrapped by ``functools.partial(fn, ...)`` (directly
    or through a name bound to it before ``at``)."""
    if closure is None or depth > 3:
        return []
    if isinstance(closure, cst.Call):
        if (model.qualname(closure.func) or "") == "functools.partial" and closure.args:
            return closure_functions(model, closure.args[0].value, at, depth + 1)
        return []
    text = dotted_name(closure)
    if not text:
        return []
    found = list(model.functions.get(text, []))
    binding = model.reaching_binding(text, at)
    if binding is not None and binding.kind == "assign" and not binding.unpacked and binding.value is not None:
        found += closure_functions(model, binding.value, at, depth + 1)
    return found
