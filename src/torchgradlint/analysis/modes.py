"""Module modes: which names hold ``nn.Module`` instances, where they enter
eval or training mode, and which mode they may be in at a given call.

PyTorch docs: ``torch.nn.Module.train`` / ``torch.nn.Module.eval`` (a module
is in training mode from construction until ``eval()``/``train(False)``; the
flag is recursive over submodules), and "Locally disabling gradient
computation" — "no_grad vs eval"
(https://pytorch.org/docs/stable/notes/autograd.html#locally-disabling-gradient-computation):
grad mode and module mode are independent switches.

Vocabulary:

- a *mode event* of module ``M`` in a scope is one of ``EVAL`` (``M.eval()``,
  ``M.train(False)``, or the same on an owner such as ``self.eval()`` for
  ``self.net``), ``TRAIN`` (``M.train()``/``M.train(True)`` on ``M`` or a
  module owner), ``TRAINED`` (a backward or optimizer step in a scope where
  ``M`` runs a forward with grad enabled: the module takes part in training,
  so it is in training mode unless an ``EVAL`` came first), ``UNKNOWN``
  (``M.train(flag)`` with a non-literal flag; ``M.train()`` or a part's
  ``M.part.eval()``/``M.part.train()`` made while grad is disabled, a
  deliberate evaluation-time choice), ``BUILT`` (a constructor call that
  binds ``M`` to a new module, which starts in training mode), or the final
  event of a same-file helper the module is passed to (``HELPER_TRAIN`` when
  that helper leaves it in training mode: a training helper whose step may
  live in another file);
- :func:`modes_at` answers "which of these may be the latest event before
  this call", following loop wrap-around (events later in an enclosing loop
  body precede the next iteration) and, on function entry, the same-file
  callers (call-site arguments mapped to parameters; ``self.x`` by name).

An empty answer means no evidence: rules stay silent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Optional

import libcst as cst

from .literals import bound_literal, falsy_literal, is_literal, is_zero_literal, literal_value, plain_bindings
from .model import (RECEIVER_METHODS, Assign, Call, ClassInfo, FileModel, GradMode, Scope, argument_for, call_params,
                    enclosing_ifs, if_branches, names_in, param_default, target_element, unwrap)
from .class_arguments import class_for_arguments, method_arguments
from .grad_mode import MODULE_MODE_MANAGERS
from .names import dotted_name
from .reads import assigned_names, binding_never_read, never_read, read_only_for_shape
from .steps import backward_call, optimizer_step
from .torch_api import (CLASS_FACTORIES, FORWARD_METHODS, MODE_FREE_LIBRARY_CLASSES, MODE_FREE_UNLESS_GIVEN, MODE_LAYER,
                        MODULE_RETURNING_METHODS, MONAI_NORM_CONFIGURED, PEFT_WRAPPERS, SAME_FORWARD_WRAPPERS)
from .tree import walk

EVAL = "eval"
TRAIN = "train"
TRAINED = "trained"
BUILT = "built"
HELPER_TRAIN = "helper-train"
UNKNOWN = "unknown"
TRAINING_KINDS = frozenset({TRAIN, TRAINED, BUILT, HELPER_TRAIN})

_MAX_DEPTH = 3
_MODULE_METHODS = frozenset({"parameters", "named_parameters", "eval", "modules", "named_modules", "buffers",
                             "named_buffers"})
_WRAPPERS = RECEIVER_METHODS
# ``torch.jit.ScriptModule`` is an ``nn.Module`` subclass (PlaNet's models derive from it).
_MODULE_BASES = frozenset({"torch.nn.Module", "torch.jit.ScriptModule", "pytorch_lightning.LightningModule",
                           "lightning.LightningModule", "lightning.pytorch.LightningModule",
                           "pytorch_lightning.core.LightningModule"})
_NOT_MODULES = frozenset({"Parameter", "ParameterList", "ParameterDict", "Buffer"})
_CONTAINERS = frozenset({"Sequential", "ModuleList", "ModuleDict"})
_PASS_THROUGH = SAME_FORWARD_WRAPPERS | {
    # torchvision's feature extractors run the given model's own submodules
    "torchvision.models._utils.IntermediateLayerGetter",
    "torchvision.models.feature_extraction.create_feature_extractor"}
# Names that hold a module by convention (``model``, ``net``, ``self.encoder``...).
MODULE_NAME = re.compile(
    r"^(model|net|network|encoder|decoder|backbone|generator|discriminator|critic|actor|policy|classifier"
    r"|netG|netD|net_g|net_d)(_?\d+)?$|^\w+_(model|net)$")
# Source tokens that make a class's forward depend on ``training``.
_MODE_SOURCE = re.compile(r"Dropout|BatchNorm|Transformer|MultiheadAttention|RReLU|\bdropout|batch_norm|"
                          r"\.training\b|track_running_stats")
# Comments and triple-quoted strings (docstrings): "see the Transformers tutorial" is no layer.
# (Other strings stay: ``getattr(nn, "Dropout")``, ``norm="batch_norm"`` may build one.)
_PROSE = re.compile(r'""".*?"""|\'\'\'.*?\'\'\'|#[^\n]*', re.S)
# Type tests name a layer class without building one (``isinstance(m, nn.BatchNorm2d)`` in a
# weight initialiser; ``isinstance(m, (nn.BatchNorm2d, nn.GroupNorm))``).
_TYPE_TEST = re.compile(r"\bisinstance\(\s*[\w.\[\]]+\s*,\s*(?:\([^()]*\)|[\w.]+)\s*\)")
# ``dropout=0`` / ``p=0.0`` keyword arguments: the layer never drops anything (``dropout=0.3``
# is no zero: the literal must end there).
_ZERO_DROPOUT = re.compile(r"\b(dropout|p|drop_rate|attn_drop|proj_drop|dropout_p)\s*=\s*0(\.0*)?(?![\w.])")
# Libraries of plain numerics and utilities (and RL environments: spaces and
# env types in annotations; progress bars, plotting, logging and data I/O: a
# ``tqdm(range(n))`` in a sampling method): their names in a class body say
# nothing about dropout or batch norm.
_NUMERIC_MODULES = frozenset({"numpy", "scipy", "einops", "random", "math", "os", "sys", "time", "logging",
                              "warnings", "copy", "re", "json", "pickle", "pathlib", "inspect", "string",
                              "numbers", "contextlib", "weakref", "types", "enum", "abc", "typing_extensions",
                              "gym", "gymnasium", "tqdm", "rich", "matplotlib", "seaborn", "pandas", "PIL",
                              "cv2", "imageio", "h5py", "yaml", "argparse", "datetime", "pprint", "shutil",
                              "glob", "csv", "io", "tempfile", "statistics", "wandb", "tensorboardX",
                              "tokenizers", "IPython", "termcolor"})
_STD_MODULES = frozenset({"math", "typing", "dataclasses", "collections", "functools", "itertools",
                          "__future__", "enum", "abc", "numbers", "operator"})
# Modules of functions, not layers: DGL's message-passing builtins (``fn.u_dot_v('h', 'h', 'score')``),
# and DGL's graph readouts (``dgl.mean_nodes(g, "h")``).
_FUNCTION_MODULES = frozenset({"dgl.function", "dgl.ops", "dgl.mean_nodes", "dgl.sum_nodes", "dgl.max_nodes",
                               "dgl.readout_nodes", "dgl.softmax_nodes", "dgl.broadcast_nodes", "dgl.mean_edges",
                               "dgl.sum_edges", "dgl.readout_edges"})


def _functional(text: str) -> bool:
    """Whether the qualified name ``text`` is (in) a module of functions (:data:`_FUNCTION_MODULES`)."""
    return any(text == f or text.startswith(f + ".") for f in _FUNCTION_MODULES)


@dataclass(frozen=True)
class ModeEvent:
    """Something that sets (or shows) a module's mode, at ``call`` in its scope.

    ``kind`` is one of :data:`EVAL`, :data:`TRAIN`, :data:`TRAINED`,
    :data:`BUILT`, :data:`UNKNOWN`.
    """

    call: Call
    kind: str

    @property
    def order(self) -> int:
        """Pre-order index of the call."""
        return self.call.order


@dataclass
class _Cache:
    modules: Optional[frozenset[str]] = None
    classes: Optional[frozenset[str]] = None
    events: dict = field(default_factory=dict)
    modes: dict = field(default_factory=dict)
    sensitive: dict = field(default_factory=dict)
    forwards: dict = field(default_factory=dict)
    instances: dict = field(default_factory=dict)
    attributes: dict = field(default_factory=dict)


def _cache(model: FileModel) -> _Cache:
    return model.cached(_Cache, _Cache)


# -- which names are modules ---------------------------------------------------------
def module_classes(model: FileModel) -> frozenset[str]:
    """Same-file classes deriving (transitively) from ``nn.Module`` (or any
    ``torch.nn`` class, e.g. ``nn.Sequential``) or a Lightning module."""
    c = _cache(model)
    if c.classes is None:
        found: set[str] = set()
        changed = True
        while changed:
            changed = False
            for name, info in model.classes.items():
                if name not in found and any(
                    b in _MODULE_BASES or b.split(".")[-1] in found or b.endswith("LightningModule")
                    or (b.startswith("torch.nn.") and b.rsplit(".", 1)[-1][:1].isupper())
                    for b in info.bases
                ):
                    found.add(name)
                    changed = True
        c.classes = frozenset(found)
    return c.classes


def _loss_class(model: FileModel, name: str, depth: int = 0) -> bool:
    """Whether the same-file class ``name`` is a loss (``class
    MaskedSoftmaxCELoss(nn.CrossEntropyLoss)``): named ``...Loss`` or derived
    from one. A loss is a module with no mode-dependent forward, so it is no
    model to evaluate (as ``nn.*Loss`` constructors are not)."""
    info = model.classes.get(name)
    if name.endswith("Loss") or info is None or depth > 5:
        return name.endswith("Loss")
    return any(b.rsplit(".", 1)[-1].endswith("Loss") or _loss_class(model, b.rsplit(".", 1)[-1], depth + 1)
               for b in info.bases if b.rsplit(".", 1)[-1] != name)


def constructor_kind(model: FileModel, node: Optional[cst.BaseExpression]) -> Optional[str]:
    """``"nn"`` for ``nn.X(...)``, ``"class"`` for a same-file module class,
    ``"zoo"`` for model-zoo factories, else ``None``."""
    node = unwrap(node)
    if not isinstance(node, cst.Call):
        return None
    qn = model.qualname(node.func) or ""
    last = qn.rsplit(".", 1)[-1]
    if qn.startswith("torch.nn.") and last[:1].isupper() and last not in _NOT_MODULES and not last.endswith("Loss"):
        return "nn"
    if "." not in qn and last in module_classes(model) and not _loss_class(model, last):
        return "class"
    if qn.startswith(("torchvision.models.", "timm.create_model")):
        return "zoo"
    return None


def module_names(model: FileModel) -> frozenset[str]:
    """Dotted names (``model``, ``self.net``) that hold ``nn.Module``
    instances somewhere in the file: bound to an ``nn.X(...)``, same-file
    module class or model-zoo constructor (through ``.to()``/``.cuda()``...),
    or receivers of ``.parameters()``/``.named_parameters()``/``.eval()``.

    ``x.train()`` alone is no evidence (HF ``trainer.train()`` is not a
    module); ``self``/``cls`` are never included.
    """
    c = _cache(model)
    if c.modules is None:
        found: set[str] = set()
        for a in model.assigns:
            if a.kind in ("assign", "annassign") and not a.unpacked and constructor_kind(model, a.value):
                found.update(t.text for t in a.targets if t.text)
        receivers = {call.receiver_text for call in model.calls
                     if call.method in _MODULE_METHODS and call.receiver_text and not call.node.args}
        found.update(r for r in receivers if not _plain_instance(model, r))
        found -= {"self", "cls"}
        c.modules = frozenset(found)
    return c.modules


def _plain_instance(model: FileModel, text: str) -> bool:
    """Whether every binding of ``text`` in the file builds an instance of a
    same-file class that is no module (``net_ensemble = DynamicNet(...)``
    or ``DynamicNet.from_file(...)`` of a plain class with its own
    ``parameters()``/``to_eval()``): its methods are the class's, not
    ``nn.Module``'s."""
    bindings = [a for a in model.assigns if a.binds(text)]
    if not bindings:
        return False
    for a in bindings:
        value = unwrap(a.value) if a.kind in ("assign", "annassign") and not a.unpacked else None
        func = value.func if isinstance(value, cst.Call) else None
        if isinstance(func, cst.Attribute):
            func = func.value  # ``Cls.from_file(...)``
        if not isinstance(func, cst.Name) or func.value not in model.classes or model.classes[func.value].bases:
            return False  # a class with a base may derive from ``nn.Module``
    return True


def instance_class(model: FileModel, text: str, at: Optional[object] = None) -> Optional[str]:
    """The same-file module class that every constructor binding of the
    dotted name ``text`` instantiates (``self.head = Head(...)`` -> ``Head``),
    or ``None``. With ``at`` (the fact where ``text`` is used), ``self.x``
    means the attribute of the class ``at`` runs in, and a binding from a
    constructor parameter (``self.model = model``) takes the class that
    parameter holds (:func:`parameter_class`). Memoised per file (the
    provenance asks it for every module call)."""
    owner = None
    if at is not None and text.startswith("self."):
        fn = model.enclosing_function(at.scope)  # type: ignore[attr-defined]
        owner = fn.class_name if fn is not None else None
    memo = _cache(model).instances
    key = (owner, text)
    if key not in memo:
        memo[key] = None  # a binding that reaches itself resolves to nothing
        memo[key] = _instance_class(model, text, owner)
    return memo[key]


def _instance_class(model: FileModel, text: str, owner: Optional[str]) -> Optional[str]:
    found: set[str] = set()
    for a in model.assigns:
        if a.kind not in ("assign", "annassign") or a.unpacked or not a.binds(text):
            continue
        fn = model.enclosing_function(a.scope)
        if owner is not None and (fn is None or fn.class_name != owner):
            continue  # ``self.model`` of another class
        value = unwrap(a.value)
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) \
                and value.func.value in module_classes(model):
            found.add(value.func.value)
        elif isinstance(value, cst.Name) and fn is not None and value.value in fn.params \
                and (cls := parameter_class(model, fn, value.value, text if owner else None)) is not None:
            found.add(cls)
        else:
            return None
    return found.pop() if len(found) == 1 else None


# nn.Module's own API: attributes every module has, no evidence of its class.
_MODULE_API = frozenset({
    "parameters", "named_parameters", "buffers", "named_buffers", "children", "named_children", "modules",
    "named_modules", "train", "eval", "training", "forward", "to", "cuda", "cpu", "half", "float", "double",
    "bfloat16", "type", "apply", "zero_grad", "requires_grad_", "state_dict", "load_state_dict", "register_buffer",
    "register_parameter", "register_module", "add_module", "get_submodule", "get_parameter", "get_buffer",
    "register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook", "share_memory",
    "extra_repr", "module", "device", "dtype", "config",
})


def parameter_class(model: FileModel, fn: Scope, param: str, attr_text: Optional[str] = None) -> Optional[str]:
    """The same-file module class the parameter ``param`` of the function
    ``fn`` holds, or ``None``: its annotation (``model: GaussianDiffusion``);
    else the class every same-file call of ``fn`` (or of its class, for
    ``__init__``) passes for it, built in the argument or in the binding of
    the name passed; else *duck typing*: the one same-file module
    class that defines every attribute the file reads on the parameter (in
    ``fn``) or on ``attr_text`` (``self.model``, in ``fn``'s class), when at
    least two of them are not ``nn.Module``'s own API. ``Trainer(diffusion_model)``
    reading ``diffusion_model.channels``, ``.is_ddim_sampling`` and
    ``.image_size`` -> ``GaussianDiffusion``."""
    node = fn.node
    if isinstance(node, cst.FunctionDef):
        for p in (*node.params.posonly_params, *node.params.params, *node.params.kwonly_params):
            if p.name.value == param and p.annotation is not None:
                ann = dotted_name(p.annotation.annotation)
                return ann if ann in module_classes(model) else None
    if fn.class_name is not None and fn.name == "__init__":
        sites = [c for c in model.calls if c.func_text == fn.class_name]  # ``Trainer(model)``
    else:
        sites = model.callers_of(fn)
    passed: set[Optional[str]] = set()
    for c in sites:
        arg = unwrap(argument_for(c, fn, param))
        if isinstance(arg, cst.Name):  # ``Trainer(forward_dynamics=net)`` with ``net = Dynamics(...)`` above
            bound = model.reaching_binding(arg.value, c)
            arg = unwrap(bound.value) if bound is not None and bound.kind in ("assign", "annassign") \
                and not bound.unpacked else arg
        passed.add(arg.func.value if isinstance(arg, cst.Call) and isinstance(arg.func, cst.Name)
                   and arg.func.value in module_classes(model) else None)
    if passed:
        return passed.pop() if len(passed) == 1 else None
    return _duck_class(model, fn, param, attr_text)


def _duck_class(model: FileModel, fn: Scope, param: str, attr_text: Optional[str]) -> Optional[str]:
    from .tree import walk

    reads = {n.attr.value for n in walk(fn.node)
             if isinstance(n, cst.Attribute) and dotted_name(n.value) == param}
    if attr_text is not None and fn.class_name in model.classes:
        reads |= {n.attr.value for n in walk(model.classes[fn.class_name].node)
                  if isinstance(n, cst.Attribute) and dotted_name(n.value) == attr_text}
    distinctive = reads - _MODULE_API
    if len(distinctive) < 2:
        return None
    matches = [c for c in sorted(module_classes(model)) if distinctive <= class_attributes(model, c)]
    return matches[0] if len(matches) == 1 else None


def class_attributes(model: FileModel, name: str) -> frozenset[str]:
    """Attributes instances of the same-file class ``name`` define: its
    methods, class-level names, ``self.x`` assigned in its methods, and the
    same of its same-file bases."""
    from .tree import walk

    memo = _cache(model).attributes
    if name in memo:
        return memo[name]
    memo[name] = frozenset()
    info = model.classes[name]
    found: set[str] = set(info.methods)
    for stmt in info.node.body.body:
        for small in stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ():
            if isinstance(small, (cst.Assign, cst.AnnAssign)):
                targets = small.targets if isinstance(small, cst.Assign) else [small]
                found |= {t.target.value for t in targets if isinstance(t.target, cst.Name)}
    for n in walk(info.node):
        targets = ()
        if isinstance(n, cst.Assign):
            targets = tuple(t.target for t in n.targets)
        elif isinstance(n, (cst.AnnAssign, cst.AugAssign)):
            targets = (n.target,)
        for t in targets:
            for el in ([e.value for e in t.elements] if isinstance(t, (cst.Tuple, cst.List)) else (t,)):
                if isinstance(el, cst.Attribute) and isinstance(el.value, cst.Name) and el.value.value == "self":
                    found.add(el.attr.value)
    for b in info.bases:
        if b.split(".")[-1] in model.classes and b.split(".")[-1] != name:
            found |= class_attributes(model, b.split(".")[-1])
    memo[name] = frozenset(found)
    return memo[name]


def is_module(model: FileModel, text: Optional[str]) -> bool:
    """Whether the dotted name ``text`` is known to hold a module."""
    return bool(text) and text in module_names(model)


# -- does the module's forward depend on its mode? ------------------------------------------
def _class_sensitive(model: FileModel, name: str, seen: set[str], info: "Optional[object]" = None,
                     zero: frozenset[str] = frozenset()) -> bool:
    """:func:`class_sensitive` of the definition ``info`` (the latest of
    ``name`` when ``None``); ``zero``: ``__init__`` parameters this instance
    gets a zero dropout rate for (:func:`_zero_rate_parameters`)."""
    if name in seen:
        return False
    seen.add(name)
    info = info if info is not None else model.classes.get(name)
    if info is None:
        return True
    for b in info.bases:
        last = b.split(".")[-1]
        if b.startswith("torch.nn.") and last[:1].isupper() and not MODE_LAYER.search(last) \
                and last not in _CONTAINERS:
            continue  # ``class LinearSub(torch.nn.Linear)``: a mode-free torch layer
        if b not in _MODULE_BASES and last not in module_classes(model) and _outside(model, b) is not False:
            return True  # a base we cannot see may use dropout or batch norm
    code = class_code(model, info)
    return code_sensitive(model, _without_zero_dropout(code, zero) if zero else code, name, seen, info.node)


# Methods a forward may run whatever the file shows: construction, the call itself and the
# forward-like entry points (:data:`~.torch_api.FORWARD_METHODS`).
_FORWARD_ROOTS = frozenset({"__init__", "__post_init__", "__call__", "__getattr__", *FORWARD_METHODS})
_SELF_ATTRIBUTE = re.compile(r"(?:\bself|\bcls|\bsuper\(\)|\btype\(self\))\s*\.\s*([A-Za-z_]\w*)")
_SELF_BINDING = re.compile(r"\bself\s*\.\s*\w+\s*(?::[^=\n]*)?(?:[-+*/@|&^%]|//|\*\*|<<|>>)?=(?!=)")


_ACCESSORS = frozenset({"staticmethod", "classmethod", "property", "cached_property", "setter", "getter",
                        "deleter"})


def _accessor(fn: cst.FunctionDef) -> bool:
    """Whether ``fn`` is a property, a static or a class method (reached without a call through ``self``)."""
    for d in fn.decorators:
        node = d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator
        if (dotted_name(node) or "").rsplit(".", 1)[-1] in _ACCESSORS:
            return True
    return False


def class_code(model: FileModel, info: ClassInfo) -> str:
    """The source of the class ``info`` that its forward may run: the class
    without the methods no forward reaches, those that are none of
    :data:`_FORWARD_ROOTS`, no property, static or class method, that no code of the file reads
    through ``self``/``cls``/``super()`` (``self.helper(x)``, in this class
    or another) or through the class (``UNet._block(...)``) and that bind no
    attribute (no ``self.x = ...``: they build no layer). Their code cannot
    make a forward depend on training mode: CORL's ``Actor.act`` reads
    ``self.training`` to pick the deterministic action at evaluation, its
    ``forward`` does not. Memoised per class."""
    def compute() -> str:
        used = model.cached("self_attributes", lambda: frozenset(_SELF_ATTRIBUTE.findall(model.source)))
        body = info.node.body
        if not isinstance(body, cst.IndentedBlock):
            return model.module.code_for_node(info.node)
        used = used | set(re.findall(rf"\b{re.escape(info.name)}\s*\.\s*([A-Za-z_]\w*)", model.source))
        kept = [stmt for stmt in body.body
                if not isinstance(stmt, cst.FunctionDef) or _accessor(stmt) or stmt.name.value in _FORWARD_ROOTS
                or stmt.name.value in used or _SELF_BINDING.search(model.module.code_for_node(stmt))]
        if len(kept) == len(body.body):
            return model.module.code_for_node(info.node)
        node = info.node.with_changes(body=body.with_changes(body=kept or [cst.SimpleStatementLine([cst.Pass()])]))
        return model.module.code_for_node(node)
    return model.cached(("class_code", id(info.node)), compute)


_DROPOUT_BUILT = r"self\.(\w+)\s*=\s*(?:[\w.]*\.)?Dropout\(\s*(?:p\s*=\s*)?({})\s*\)"


def _without_zero_dropout(code: str, zero: frozenset[str]) -> str:
    """``code`` (a class) without the dropout layers built from the ``zero``
    parameters (``self.drop = nn.Dropout(dropout)`` with ``dropout`` 0 for
    this instance), their uses (``self.drop(x)``) and the parameters' names;
    anything else the parameters reach (``nn.MultiheadAttention(d, h,
    dropout=dropout)``) still names its layer."""
    names = "|".join(sorted(map(re.escape, zero)))
    built = re.compile(_DROPOUT_BUILT.format(names))
    attrs = {m.group(1) for m in built.finditer(code)}
    code = built.sub("", code)
    if attrs:
        code = re.sub(r"self\.(?:{})\b".format("|".join(sorted(map(re.escape, attrs)))), "_", code)
    return re.sub(r"\b(?:{})\b".format(names), "_", code)


def _zero_rate_parameters(model: FileModel, call: cst.Call, info: "ClassInfo") -> frozenset[str]:
    """The parameters of the class's ``__init__`` that ``call`` (a
    construction of the class) fills with a literal zero, by argument or by
    default (``CausalAttention(d_in, d_out, ctx_len, 0.0)``: the dropout rate)."""
    init = info.methods.get("__init__")
    values = method_arguments(init.node, call) if init is not None else None
    return frozenset(p.name.value for p, value in values or () if is_zero_literal(value))


_IDENTIFIER_CHAR = re.compile(r"[A-Za-z0-9_]")


def spells_mode_layer(model: FileModel, code: str, pattern: "re.Pattern[str]") -> bool:
    """Whether ``pattern`` (a mode-layer token: ``Dropout``, ``Transformer``...)
    matches in ``code`` outside the names of the file's own classes: a class
    ``TransformerBlock`` of RMSNorm and linear layers is judged by its body
    (its callers look into it), not by its name."""
    for m in pattern.finditer(code):
        start, end = m.start(), m.end()
        while start > 0 and _IDENTIFIER_CHAR.match(code[start - 1]):
            start -= 1
        while end < len(code) and _IDENTIFIER_CHAR.match(code[end]):
            end += 1
        if code[start:end] not in model.classes or code[start - 1:start] == ".":
            return True  # ``nn.Transformer`` is torch's, though a class of the file shares its name
    return False


def class_sensitive(model: FileModel, name: str) -> bool:
    """Whether the same-file class ``name`` may have a forward that depends
    on training mode: dropout or batch norm in its body or in a same-file
    module class it uses, a base or an imported layer that cannot be shown
    mode-free (see :func:`code_sensitive`)."""
    return _class_sensitive(model, name, set())


def code_sensitive(model: FileModel, code: str, name: str, seen: set[str],
                   node: Optional[cst.CSTNode] = None) -> bool:
    """Whether the source ``code`` of the definition ``name`` (a class body,
    or a function of the project that builds layers) may make a forward
    depend on training mode: a dropout/batch-norm/``.training`` token
    (outside comments and docstrings), a same-file module class that may
    or a module-level function of the file it calls whose code may,
    or a name imported from outside torch and the standard/numeric
    libraries that the project index (when the file has one) cannot show to
    be mode-free (a torchvision/timm backbone) and that is not a library
    layer mode-free unless given a dropout rate, built without one in
    ``node`` (the definition's tree, when given: ``DPLSTM(d, h)``).
    ``seen``: classes already visited (cycles count as mode-free)."""
    code = _TYPE_TEST.sub("isinstance()", _PROSE.sub("", code))
    if spells_mode_layer(model, _ZERO_DROPOUT.sub("", code), _MODE_SOURCE):
        return True
    project = model.project
    for word in set(re.findall(r"\b[A-Za-z_][A-Za-z0-9_]*\b", code)):
        if word != name and word not in seen and word in _defined_functions(model) \
                and re.search(rf"(?<![\w.]){word}\s*\(", code):  # called, not handed over (``self.apply(init)``)
            # ``nn.Sequential(fc_batchnorm_act(28*28, 512), ...)``: a same-file function that builds layers
            seen.add(word)
            if any(code_sensitive(model, model.module.code_for_node(f.node), word, seen, f.node)
                   for f in model.scopes if f.kind == "function" and f.name == word
                   and f.parent is model.module_scope):
                return True
        if word in model.classes and word != name and word in module_classes(model):
            built = _constructions_of(model, node, word) if node is not None else None
            if built is not None:  # judged by what each construction's literal arguments build
                if any(_class_sensitive(model, word, set(seen), info, zero) for info, zero in built):
                    return True
            elif _class_sensitive(model, word, seen):
                return True
        target = model.names.aliases.get(word)
        if target and target.split(".")[0] not in ("torch", *_STD_MODULES, *_NUMERIC_MODULES) \
                and not _functional(target):
            if node is not None and _built_mode_free(model, node, word, target) or not _may_build(code, word):
                continue
            if any(_outside(model, t) is not False for t in _reached_through(code, word, target)
                   if not _functional(t) and t not in MODE_FREE_LIBRARY_CLASSES):
                return True  # e.g. a torchvision/timm backbone
        elif target is None and project is not None and project.imports_relatively(word) \
                and _may_build(code, word) and _outside(model, word) is not False:
            return True  # ``from .layers import Block``: a project definition that may
    return False


def _constructions_of(model: FileModel, node: cst.CSTNode,
                      word: str) -> "Optional[list[tuple[ClassInfo, frozenset[str]]]]":
    """The same-file class ``word`` as each of its constructions in ``node``
    builds it (pruned by literal arguments, with its zero-rate parameters),
    when ``word`` appears in ``node`` only as the callee of constructor calls
    (``ResidualBlock(..., resample='down')``); else ``None``."""
    info = model.classes.get(word)
    if info is None:
        return None
    calls, uses = [], 0
    for n in walk(node):
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value == word:
            calls.append(n)
        elif isinstance(n, cst.Name) and n.value == word:
            uses += 1
    if not calls or uses != len(calls):
        return None
    return [(class_for_arguments(model, info, c) or info, _zero_rate_parameters(model, c, info)) for c in calls]


_ATTRIBUTE_CHAIN = r"(?:\s*\.\s*\w+)+"


def _may_build(code: str, word: str) -> bool:
    """Whether ``code`` may build a layer with ``word``: it calls it or
    something reached through it (``Block(...)``, ``timm.create_model(...)``)
    or uses the name itself as a value (a base class, ``rnn=DPLSTM``); a name
    only read through attributes (``wandb.config.hidden_size``) builds none."""
    for m in re.finditer(rf"(?<![\w.]){re.escape(word)}\b", code):
        chain = re.match(_ATTRIBUTE_CHAIN, code[m.end():])
        if chain is None or re.match(r"\s*\(", code[m.end() + chain.end():]):
            return True
    return False


def _reached_through(code: str, word: str, target: str) -> list[str]:
    """What ``code`` takes from the imported name ``word`` (bound to
    ``target``): ``target.Attr`` for each attribute read on it when it is
    only read through attributes (``import modules`` then
    ``modules.GlimpseNetwork(...)``: the module's classes, not the module),
    else ``target`` itself."""
    found: set[str] = set()
    for m in re.finditer(rf"(?<![\w.]){re.escape(word)}\b", code):
        attr = re.match(r"\s*\.\s*(\w+)((?:\s*\.\s*\w+)*)", code[m.end():])
        if attr is None:
            return [target]
        chain = f"{target}.{attr.group(1)}" + re.sub(r"\s+", "", attr.group(2))
        # ``dgl.distributed.DistEmbedding`` when a known library class, else the first attribute
        found.add(chain if chain in MODE_FREE_LIBRARY_CLASSES else f"{target}.{attr.group(1)}")
    return sorted(found) or [target]


def _built_mode_free(model: FileModel, node: cst.CSTNode, word: str, target: str) -> bool:
    """Whether ``word`` (bound to the library class ``target``) appears in
    ``node`` only as the callee of constructor calls, each building the
    class without dropout or normalisation: ``target`` is mode-free
    (:data:`MODE_FREE_LIBRARY_CLASSES`) or mode-free unless given those
    (:data:`MODE_FREE_UNLESS_GIVEN`) and no call gives them."""
    if target not in MODE_FREE_LIBRARY_CLASSES and target not in MODE_FREE_UNLESS_GIVEN \
            and target not in MONAI_NORM_CONFIGURED:
        return False
    calls, uses = [], []
    for n in walk(node):
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value == word:
            calls.append(n)
        elif isinstance(n, cst.Name) and n.value == word:
            uses.append(n)
    callees = {id(c.func) for c in calls}
    return bool(calls) and all(id(u) in callees for u in uses) \
        and not any(_expr_sensitive(model, c) for c in calls)


def _outside(model: FileModel, text: str) -> Optional[bool]:
    """Whether a name the file takes from elsewhere (``text``: qualified, or
    bound by a relative import) may depend on training mode, as the project
    index tells (:mod:`torchgradlint.project_index`); ``None`` when the
    file has no index or the index cannot resolve the name. A bare name no
    import binds is looked up in the project modules the file star-imports
    (``from models import *`` then ``DQN(n_actions=4)``)."""
    if model.project is None:
        return None
    found = model.project.sensitive(text)
    if found is None and "." not in text and text not in model.names.aliases and model.names.star_modules:
        answers = {model.project.sensitive(f"{m}.{text}") for m in model.names.star_modules} - {None}
        found = (True in answers) if answers else None
    return found


def _expr_sensitive(model: FileModel, node: cst.BaseExpression, seen: frozenset[str] = frozenset(),
                    at: Optional[int] = None) -> bool:
    """Whether the module-building expression ``node`` may build a module
    whose forward depends on training mode. A layer named by a variable
    (``nn.Sequential(nn.Linear(2, 5), act, ...)``, ``act()``) or by a ``self``
    attribute (``self.blur_h``) counts by what every binding of that name in
    the file builds (:func:`_bound_values`); anything else that is not a call
    is unknown, so sensitive. ``at``: the
    pre-order index of the binding, for a class the file defines twice."""
    node = unwrap(node)
    if isinstance(node, cst.Lambda):
        return False  # a function, not a module
    if isinstance(node, cst.IfExp):  # ``nn.LayerNorm(h) if layernorm else nn.Identity()``: either branch
        return any(_expr_sensitive(model, branch, seen, at) for branch in (node.body, node.orelse))
    if isinstance(node, cst.Name):
        if node.value == "None":
            return False  # ``Attention(d) if use_attn else None``: no module
        if node.value in _defined_functions(model):
            return False
        values = _bound_values(model, node.value, seen)
        return values is None or any(_expr_sensitive(model, v, seen | {node.value}) for v in values)
    text = dotted_name(node) if isinstance(node, cst.Attribute) else None
    if text and text.startswith("self."):
        # ``nn.Sequential(pad, self.blur_h, self.blur_v)``: what the class binds to the attribute
        values = _bound_values(model, text, seen)
        return values is None or any(_expr_sensitive(model, v, seen | {text}) for v in values)
    if not isinstance(node, cst.Call):
        return True
    qn = model.qualname(node.func) or ""
    if isinstance(node.func, cst.Name) and qn == node.func.value and qn not in model.classes:
        # ``act = nn.ReLU`` ... ``act()``: the call builds what the class bound to the variable builds
        classes = _bound_values(model, qn, seen)
        if classes is not None:
            return any(_expr_sensitive(model, node.with_changes(func=c), seen | {qn}) for c in classes)
        built = _factory_returns_sensitive(model, qn, seen, _live_definitions(model, node), node)
        if built is not None:
            return built
    if qn in _COPIES and len(node.args) == 1 and not node.args[0].star:
        return _expr_sensitive(model, node.args[0].value, seen, at)  # ``copy.deepcopy(net)``: the same layers
    if isinstance(node.func, cst.Attribute) and dotted_name(node.func.value) == "self":
        fact = model.call_for(node)
        methods = model.resolve_callee(fact) if fact is not None else []
        if len(methods) == 1:  # ``self.model = self.make_model()``: what the method returns
            built = _factory_returns_sensitive(model, f"self.{node.func.attr.value}", seen, methods)
            if built is not None:
                return built
    if qn == "torch.load":
        saved = _saved_to(model, node, seen)
        if saved is not None:
            return any(_expr_sensitive(model, v, seen | {_LOADED}) for v in saved)
    last = qn.rsplit(".", 1)[-1]
    if qn.startswith("torch.nn."):
        if MODE_LAYER.search(last) or any(a.keyword and a.keyword.value == "dropout"
                                           and not _ZERO_DROPOUT.fullmatch(f"dropout={_code(a.value)}")
                                           for a in node.args):
            return True
        if last in _CONTAINERS:
            for a in node.args:
                values = [a.value]
                if isinstance(a.value, (cst.List, cst.Tuple)):
                    values = [e.value for e in a.value.elements]
                elif isinstance(a.value, cst.Call) and (model.qualname(a.value.func) or "").rsplit(".", 1)[-1] \
                        in ("OrderedDict", "dict") and a.value.args \
                        and isinstance(a.value.args[0].value, (cst.List, cst.Tuple)):
                    # ``Sequential(OrderedDict([("fc", nn.Linear(...)), ...]))``: the named layers
                    values = [e.value.elements[-1].value if isinstance(e.value, cst.Tuple) and e.value.elements
                              else e.value for e in a.value.args[0].value.elements]
                if a.star:
                    values = list_items(model, a.value, seen) if a.star == "*" else None
                    if values is None:
                        return True  # ``Sequential(*layers)`` of a list the file does not show
                if any(_expr_sensitive(model, v, seen) for v in values):
                    return True
        return False
    if "." not in qn and last in model.classes:
        info = model.class_at(last, at) if at is not None else model.classes[last]
        zero = _zero_rate_parameters(model, node, info) if info is not None else frozenset()
        built = class_for_arguments(model, info, node) if info is not None else None
        return _class_sensitive(model, last, set(), built or info, zero)
    base = _adapted_without_dropout(model, node)
    if base is not None:
        return base in seen or _expr_sensitive(model, cst.parse_expression(base), seen)
    cls = qn.rsplit(".", 1)[0] if last in CLASS_FACTORIES else qn
    if cls in MODE_FREE_LIBRARY_CLASSES:  # a dropout rate (``dropout``, ``dropout_cattn``) or unseen arguments
        return any(a.star == "**" or a.keyword and "dropout" in a.keyword.value
                   and not _ZERO_DROPOUT.fullmatch(f"dropout={_code(a.value)}") for a in node.args)
    if cls in MODE_FREE_UNLESS_GIVEN:
        return _gives_mode_arguments(node, MODE_FREE_UNLESS_GIVEN[cls])
    if cls in MONAI_NORM_CONFIGURED:
        return _monai_mode_arguments(node, MONAI_NORM_CONFIGURED[cls])
    return _outside(model, qn) is not False  # a class of the project: the index may know it


def _call_arguments(node: cst.Call) -> Optional[tuple[list[cst.BaseExpression], dict[str, cst.BaseExpression]]]:
    """The positional and the keyword arguments of ``node``; ``None`` when
    it passes ``*args`` or ``**kwargs`` (arguments the linter cannot see)."""
    if any(a.star for a in node.args):
        return None
    return ([a.value for a in node.args if a.keyword is None],
            {a.keyword.value: a.value for a in node.args if a.keyword is not None})


def _gives_mode_arguments(node: cst.Call, dropout_position: int) -> bool:
    """Whether a constructor call of a :data:`MODE_FREE_UNLESS_GIVEN` class
    gives it a dropout rate other than 0 (by keyword or at
    ``dropout_position``), a ``norm`` other than ``None``, or arguments
    it cannot see (``*args``, ``**kwargs``)."""
    found = _call_arguments(node)
    if found is None:
        return True
    positional, keywords = found
    if len(positional) > dropout_position and not is_zero_literal(positional[dropout_position]):
        return True
    if "dropout" in keywords and not is_zero_literal(keywords["dropout"]):
        return True
    if "norm" in keywords and not is_literal(keywords["norm"], None):
        return True
    return len(positional) > dropout_position + 4  # ``norm`` given by position


# Norms without running statistics, as MONAI's norm arguments name them (``"instance"``,
# ``Norm.GROUP``, ``("group", {"num_groups": 8})``).
_STATELESS_NORM = re.compile(r"^\W*(?:Norm\.)?(?:instance|group|layer)\b", re.IGNORECASE)


def _monai_mode_arguments(node: cst.Call, norm_position: int) -> bool:
    """Whether a constructor call of a :data:`MONAI_NORM_CONFIGURED` network
    gives it a dropout rate other than 0 (any keyword naming one: ``dropout``,
    ``drop_rate``, ``dropout_path_rate``), a norm that is not instance, group
    or layer norm (``norm``/``norm_name``: batch norm, or a value it cannot
    read), or arguments it cannot see (``*args``, ``**kwargs``, more
    positional arguments than come before the norm)."""
    found = _call_arguments(node)
    if found is None:
        return True
    positional, keywords = found
    if any("drop" in name and not is_zero_literal(value) for name, value in keywords.items()):
        return True
    for name in ("norm", "norm_name"):
        value = keywords.get(name)
        if isinstance(value, cst.Tuple) and value.elements:
            value = value.elements[0].value
        text = literal_value(value) if isinstance(value, cst.SimpleString) else dotted_name(value) if value else ""
        if value is not None and (not isinstance(text, str) or not _STATELESS_NORM.match(text)):
            return True
    return len(positional) > norm_position


_LOADED = "<torch.load>"


def _saved_to(model: FileModel, load: cst.Call, seen: frozenset[str]) -> Optional[list]:
    """For ``torch.load(path)``, the objects this file itself pickles to
    that path (``torch.save(model, path)``: a notebook's checkpoint restored
    in a later cell is the model it saved), each as the values its name is
    bound to apart from loads and rebindings to itself (a load of what was
    loaded, ``net = net.to(device)``, adds no class).
    ``None`` (unknown) when the path is no literal (nor a name bound to one),
    nothing in the file saves to it, or a saved object's bindings are not all
    visible. PyTorch docs: ``torch.save`` / ``torch.load`` ("Saving and
    loading models": the whole module is pickled)."""
    if _LOADED in seen:
        return []
    saves = saved_objects(model, load)
    if saves is None:
        return None
    out: list = []
    for obj, _ in saves:
        obj = unwrap(obj)
        if not isinstance(obj, cst.Name):
            out.append(obj)
            continue
        values = _bound_values(model, obj.value, seen)
        if values is None:
            return None
        out.extend(v for v in values if not (isinstance(unwrap(v), cst.Call)
                                             and model.qualname(unwrap(v).func) == "torch.load")
                   and not _rewraps_itself(v, obj.value) and dotted_name(unwrap(v)) != obj.value)
    return out or None


def saved_objects(model: FileModel, load: cst.Call) -> Optional[list[tuple[cst.BaseExpression, Call]]]:
    """For ``torch.load(path)`` with a literal path (or a name bound only to
    one), each object this file passes to ``torch.save(obj, path)`` with the
    same path, with that save call; ``None`` when the path is not literal,
    nothing saves to it, or a save's object cannot be read."""
    path = _path_literal(model, load.args[0].value if load.args and load.args[0].keyword is None
                         else next((a.value for a in load.args if a.keyword and a.keyword.value == "f"), None))
    if path is None:
        return None
    out = []
    for c in model.calls:
        if c.qualname == "torch.save" and _path_literal(model, c.arg(1, "f")) == path:
            obj = c.arg(0, "obj")
            if obj is None:
                return None
            out.append((obj, c))
    return out or None


def _path_literal(model: FileModel, node: Optional[cst.BaseExpression]) -> Optional[str]:
    """The text of a string-literal path, directly or through a name every
    binding of which in the file is that same literal; or, for a path built
    from constants (``OUTPUT_PATH + "discriminator.pt"``, ``str(out / "g.pt")``,
    an f-string), its code without spaces, when every name in it is bound at
    most once in the file, by a module-level assignment (or an import): two
    such paths with the same code name the same file."""
    text = bound_literal(model, node)
    if isinstance(text, str):
        return text
    if isinstance(node, (cst.Name, cst.Attribute, cst.BinaryOperation, cst.Call, cst.FormattedString)):
        for name in {n.value for n in walk(node) if isinstance(n, cst.Name)}:
            bindings = [a for a in model.assigns if a.binds(name)]
            if len(bindings) > 1 or bindings and (bindings[0].kind != "assign"
                                                  or bindings[0].scope is not model.module_scope):
                return None
        return "=" + re.sub(r"\s+", "", model.module.code_for_node(node))  # ``=``: no literal path starts so
    return None


def _live_definitions(model: FileModel, node: cst.Call) -> Optional[list[Scope]]:
    """The top-level definitions the call ``node`` runs, when the file
    defines its function more than once and the call picks one (a notebook
    that redefines ``get_model()`` in a later cell: a top-level call runs
    the last definition before it); ``None`` to take every definition."""
    fact = model.call_for(node)
    found = model.resolve_callee(fact) if fact is not None else []
    return found if found and all(s.parent is model.module_scope for s in found) else None


def _factory_returns_sensitive(model: FileModel, name: str, seen: frozenset[str],
                               scopes: Optional[list] = None, call: Optional[cst.Call] = None) -> Optional[bool]:
    """For a call of the file's top-level function ``name`` (``get_net(n)``
    whose body builds ``net = nn.Linear(n, 1)`` and returns it), or of the
    function ``scopes`` (a method the call resolves to: ``self.make_model()``):
    whether what it returns may depend on the mode, judged on every
    ``return`` (a returned name by its bindings that reach the ``return``;
    with ``call``, a returned parameter, or a copy of one, by the argument
    ``call`` gives it: ``model = train(Net())``, ``pruned =
    prune(model)`` whose body returns ``copy.deepcopy(base)``); ``None``
    when ``name`` is no such function or a ``return`` gives nothing."""
    if name in seen:
        return None
    if scopes is None:
        if name not in _defined_functions(model):
            return None
        scopes = [sc for sc in model.scopes if sc.kind == "function" and sc.name == name
                  and sc.parent is model.module_scope]
    returns = [r for sc in scopes for r in model.returns_of(sc)]
    if not returns or any(r.value is None for r in returns):
        return None
    inner = seen | {name}
    for r in returns:
        value = unwrap(r.value)
        given = _returned_argument(model, r, call) if call is not None else None
        if given is not None:
            if _argument_sensitive(model, given, call, inner):
                return True
            continue
        if isinstance(value, cst.Name):
            found = _bindings_sensitive(model, value.value, model.reaching_bindings(value.value, r), seen=inner)
            if found is not False:
                return True
        elif _expr_sensitive(model, value, inner):
            return True
    return False


# Copies of a module: the same layers, so the same dependence on the mode.
_COPIES = frozenset({"copy.deepcopy", "copy.copy"})


def _returned_argument(model: FileModel, ret, call: cst.Call) -> Optional[cst.BaseExpression]:
    """The argument of ``call`` that the ``return`` ``ret`` of the called
    function hands back: a parameter returned as is, moved (``.to(device)``)
    or copied (``copy.deepcopy``), directly or through up to three plain
    assignments in the function (``m = copy.deepcopy(base)`` ... ``return
    m``); the default when the call leaves it out; ``None`` otherwise."""
    value, at = ret.value, ret
    for _ in range(4):
        value = unwrap(value)
        if isinstance(value, cst.Call) and model.qualname(value.func) in _COPIES and len(value.args) == 1 \
                and not value.args[0].star:
            value = unwrap(value.args[0].value)
        if not isinstance(value, cst.Name):
            return None
        bindings = model.reaching_bindings(value.value, at)
        if len(bindings) != 1:
            return None
        b = bindings[0]
        if b.kind == "param":
            fn = model.enclosing_function(ret.scope)
            site = model.call_for(call)
            if fn is None or fn.class_name is not None or site is None or any(a.star for a in call.args):
                return None  # (a method: what its receiver holds is another question)
            given = argument_for(site, fn, value.value)
            return given if given is not None else param_default(fn, value.value)
        if b.kind not in ("assign", "annassign") or b.unpacked or b.value is None:
            return None
        value, at = b.value, b
    return None


def _argument_sensitive(model: FileModel, arg: cst.BaseExpression, call: cst.Call, seen: frozenset[str]) -> bool:
    """Whether the argument ``arg`` of ``call`` may be a module whose forward
    depends on the mode: a name by its bindings that reach the call site,
    anything else by what it builds."""
    arg = unwrap(arg)
    fact = model.call_for(call) if isinstance(arg, cst.Name) else None
    if fact is not None:
        found = _bindings_sensitive(model, arg.value, model.reaching_bindings(arg.value, fact), seen=seen)
        return found is not False
    return _expr_sensitive(model, arg, seen)


def _bound_values(model: FileModel, name: str, seen: frozenset[str]) -> Optional[list]:
    """The values of every binding of the variable ``name`` anywhere in the
    file, when each is a plain assignment (not a parameter, a loop or
    ``with`` target, an unpacking or an augmented assignment); ``None``
    otherwise, or for a name bound in terms of itself (unknown)."""
    bindings = plain_bindings(model, name) if name not in seen else None
    return None if bindings is None else [a.value for a in bindings]


#: list methods that add items (``layers.append(nn.Linear(a, b))``)
LIST_ADDS = frozenset({"append", "extend", "insert"})


def list_items(model: FileModel, node: cst.BaseExpression, seen: frozenset[str] = frozenset()) -> Optional[list]:
    """What the list ``node`` unpacked into a container (``nn.Sequential(*layers)``)
    may hold: the elements of every display and comprehension bound to the
    variable (both branches of a conditional expression), then every value added to it anywhere in the file, in source
    order (``layers.append(nn.Linear(a, b))``, ``extend([...])``, ``insert(i,
    x)``); ``None`` when one of these is not visible (``layers += [...]``,
    ``extend(other)``)."""
    node = unwrap(node)
    if isinstance(node, (cst.List, cst.Tuple)):
        displays = [node]
    elif isinstance(node, cst.Name):
        displays = _bound_values(model, node.value, seen)
        if displays is None:
            return None
        for a in model.assigns:
            if a.kind == "augassign" and a.binds(node.value):
                return None  # ``layers += [...]``: kept simple, unknown
    else:
        return None
    items: list = []
    todo = list(displays)
    while todo:
        d = unwrap(todo.pop(0))
        if isinstance(d, cst.IfExp):  # ``[ODEBlock(f)] if is_odenet else [ResBlock(64, 64) for _ in range(6)]``
            todo += [d.body, d.orelse]
            continue
        if isinstance(d, (cst.List, cst.Tuple)) and not any(isinstance(e, cst.StarredElement) for e in d.elements):
            items += [e.value for e in d.elements]
        elif isinstance(d, cst.ListComp):
            items.append(d.elt)
        else:
            return None
    if isinstance(node, cst.Name):
        for c in model.calls:
            if c.receiver_text != node.value or c.method not in LIST_ADDS:
                continue
            arg = c.arg(1 if c.method == "insert" else 0)
            if arg is None or any(a.star for a in c.node.args):
                return None
            if c.method == "extend":
                arg = unwrap(arg)
                if not isinstance(arg, (cst.List, cst.Tuple)) or any(isinstance(e, cst.StarredElement)
                                                                     for e in arg.elements):
                    return None
                items += [e.value for e in arg.elements]
            else:
                items.append(arg)
    return items


def _adapted_without_dropout(model: FileModel, value: cst.BaseExpression) -> Optional[str]:
    """For ``get_peft_model(base, config)`` (:data:`PEFT_WRAPPERS`) whose
    config is a ``peft.*Config`` call, directly or through every binding of
    a name, that gives no adapter dropout (no ``*dropout`` keyword other than
    0, no positional or ``**`` argument: PEFT's dropout defaults are 0.0),
    the dotted name of ``base``: the adapted model is mode-sensitive exactly
    when ``base`` is. ``None`` otherwise."""
    value = unwrap(value)
    if not isinstance(value, cst.Call) or (model.qualname(value.func) or "") not in PEFT_WRAPPERS:
        return None
    if any(a.star for a in value.args):
        return None
    positional = [a.value for a in value.args if a.keyword is None]
    keywords = {a.keyword.value: a.value for a in value.args if a.keyword is not None}
    base = positional[0] if positional else keywords.get("model")
    config = positional[1] if len(positional) > 1 else keywords.get("peft_config")
    text = dotted_name(base) if base is not None else None
    if not text or config is None:
        return None
    config = unwrap(config)
    configs = _bound_values(model, config.value, frozenset()) if isinstance(config, cst.Name) else [config]
    for c in configs or [None]:
        c = unwrap(c) if c is not None else None
        if not isinstance(c, cst.Call):
            return None
        qn = model.qualname(c.func) or ""
        if not (qn.startswith("peft.") and qn.endswith("Config")):
            return None
        if any(a.star or a.keyword is None or ("dropout" in a.keyword.value and not is_zero_literal(a.value))
               for a in c.args):
            return None
    return text


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _rewraps_itself(value: cst.BaseExpression, text: str) -> bool:
    """``f(text)`` with the module itself as the only argument (the
    rebinding ``text = f(text)``: ``accelerator.prepare(model)``,
    ``fabric.setup(model)``, ``DDP(model)``); its forward is the module's."""
    return (isinstance(value, cst.Call) and len(value.args) == 1 and value.args[0].keyword is None
            and not value.args[0].star and dotted_name(value.args[0].value) == text)


def mode_sensitive(model: FileModel, text: str) -> bool:
    """Whether the module named ``text`` may behave differently in training
    and eval mode (dropout, batch norm...). ``False`` only when every
    constructor binding of ``text`` in the file is visible and has no such
    layer; unknown origins count as sensitive."""
    c = _cache(model)
    if text in c.sensitive:
        return c.sensitive[text]
    c.sensitive[text] = True  # a module that wraps itself through another name: unknown
    result = _bindings_sensitive(model, text, [a for a in model.assigns if a.binds(text)])
    c.sensitive[text] = result is not False
    return c.sensitive[text]


def _bindings_sensitive(model: FileModel, text: str, bindings: list, functions: bool = False,
                        seen: frozenset[str] = frozenset()) -> Optional[bool]:
    """:func:`mode_sensitive` over the given bindings of ``text``: ``None``
    when none of them constructs or wraps a module (no evidence either way);
    a wrapper of another module (``ddp_model = DDP(model, ...)``) is that
    module; ``functions``: see :func:`_built_values`; ``seen``: the
    functions and variables being resolved (see :func:`_expr_sensitive`)."""
    built = _built_values(model, text, bindings, functions, with_order=True)
    wrapped = {w for a in bindings if a.kind in ("assign", "annassign") and not a.unpacked
               and isinstance(unwrap(a.value), cst.Call)
               and (w := same_module(a.value, model)) is not None and w != text}
    given = _parameter_classes(model, bindings)
    if not built and not wrapped and not given:
        return None
    return any(_expr_sensitive(model, value, seen, order) for value, order in built) \
        or any(mode_sensitive(model, w) for w in sorted(wrapped)) \
        or any(class_sensitive(model, cls) for cls in sorted(given))


def _parameter_classes(model: FileModel, bindings: list) -> set[str]:
    """The same-file module classes that bindings from a parameter hold
    (``self.actor = actor`` in ``__init__(self, actor: Actor, ...)``, or
    every same-file construction passing an ``Actor(...)``: see
    :func:`parameter_class`); a parameter of unknown class adds nothing."""
    out: set[str] = set()
    for a in bindings:
        value = unwrap(a.value, MODULE_RETURNING_METHODS) if a.kind in ("assign", "annassign") else None
        if a.unpacked or not isinstance(value, cst.Name):
            continue
        fn = model.enclosing_function(a.scope)
        if fn is not None and value.value in fn.params:
            cls = parameter_class(model, fn, value.value)
            if cls is not None:
                out.add(cls)
    return out


# Layers whose output is random, or depends on the mode otherwise than batch norm's statistics.
_DROPOUT_SOURCE = re.compile(r"Dropout|\bdropout|Transformer|MultiheadAttention|RReLU|\.training\b|"
                             r"scaled_dot_product_attention")


def dropout_free_at(model: FileModel, call: Call, text: str) -> bool:
    """Whether every construction of the module ``text`` that may reach
    ``call`` is visible in the file and holds no dropout (nor attention,
    RReLU, or a ``self.training`` branch): batch norm is its only
    mode-dependent layer. ``False`` when a construction is not visible (a
    parameter, an imported factory, a layer imported from another package)."""
    return _constructions_free_of(model, call, text, "dropout")


# Layers whose training mode changes state: batch norm's running statistics (and a custom
# ``self.training`` branch, which may update buffers as a codebook's EMA does).
_STATISTICS_SOURCE = re.compile(r"BatchNorm|batch_norm|InstanceNorm|instance_norm|running_mean|running_var|"
                                r"\.training\b")


def statistics_free_at(model: FileModel, call: Call, text: str) -> bool:
    """Whether every construction of the module ``text`` that may reach
    ``call`` is visible in the file and holds no batch norm (nor instance
    norm, running statistics or a ``self.training`` branch): a forward in
    training mode changes no state, dropout is its only mode-dependent layer.
    ``False`` when a construction is not visible."""
    return _constructions_free_of(model, call, text, "statistics")


def _constructions_at(model: FileModel, call: Call, text: str) -> list:
    """The values that build the module ``text`` where ``call`` runs: those of
    its bindings that may reach the call, else of every binding in the file."""
    here = _built_values(model, text, model.reaching_bindings(text, call))
    return here or _built_values(model, text, [a for a in model.assigns if a.binds(text)])


def visibly_sensitive_at(model: FileModel, call: Call, text: str) -> bool:
    """Whether every construction of the module ``text`` that may reach
    ``call`` is visible in the file and holds a mode-dependent layer: a
    ``torch.nn`` layer that is or holds one, a same-file module class that
    :func:`class_sensitive` judges so, or a model-zoo factory
    (``torchvision.models.*``, ``timm.create_model``: batch norm or dropout).
    ``False`` when a construction is not visible (a parameter, a factory of
    another file) or mode-free. Stricter than :func:`mode_sensitive_at`,
    which takes what it cannot see as possibly dependent on the mode."""
    ctors = _constructions_at(model, call, text)
    if not ctors:
        return False
    for v in ctors:
        v = unwrap(v, MODULE_RETURNING_METHODS)
        kind = constructor_kind(model, v)
        if kind == "zoo":
            continue
        if kind == "class" and class_sensitive(model, dotted_name(v.func) or ""):
            continue
        if kind == "nn" and any(not _code_free_of(model, model.module.code_for_node(v), k, set())
                                for k in ("dropout", "statistics")):
            continue
        return False
    return True


def _constructions_free_of(model: FileModel, call: Call, text: str, kind: str) -> bool:
    ctors = _constructions_at(model, call, text)
    loaded = [v for v in ctors if isinstance(v, cst.Call) and model.qualname(v.func) == "torch.load"]
    for v in loaded:  # a checkpoint of the whole module: what this file saved there, else not visible
        saved = _saved_to(model, v, frozenset())
        if saved is None:
            return False
        ctors = [c for c in ctors if c is not v] + [unwrap(c) for c in saved]
    return bool(ctors) and all(
        isinstance(v, cst.Call) and _code_free_of(model, model.module.code_for_node(v), kind, set())
        for v in ctors)


def gated_off_at(model: FileModel, call: Call, text: str) -> bool:
    """Whether every construction of the module ``text`` that may reach
    ``call`` is a same-file class whose forward runs its mode-dependent
    layers only under a parameter that ``call`` leaves off: DSKSD's
    ``forward(self, inputs, is_training=False)`` applies ``self.dropout``
    only ``if is_training:``, so ``model(x)`` runs no dropout whatever
    ``model.training`` says (while ``model(x, is_training=True)`` does).
    A parameter is off when its default is ``False``, ``None`` or ``0`` and
    the call passes nothing for it, or one of those literals; a call with
    ``*args``/``**kwargs`` gives no answer (``False``)."""
    if call.func_text not in (text, f"{text}.forward"):
        return False  # ``model.generate(...)`` takes other arguments
    ctors = _constructions_at(model, call, text)
    if not ctors:
        return False
    for v in ctors:
        v = unwrap(v, MODULE_RETURNING_METHODS)
        info = model.classes.get(dotted_name(v.func) or "") if isinstance(v, cst.Call) else None
        forward = info.methods.get("forward") if info is not None else None
        if forward is None or not isinstance(forward.node, cst.FunctionDef):
            return False
        off = _gates_left_off(forward.node, call.node)
        if not off or _class_sensitive_with_gates_off(model, info, off):
            return False
    return True


def _gates_left_off(forward: cst.FunctionDef, call: cst.Call) -> frozenset[str]:
    """The parameters of ``forward`` with a ``False``/``None``/``0`` default
    that ``call`` (of the module, so without ``self``) leaves at such a value."""
    return frozenset(p.name.value for p, value in method_arguments(forward, call) or ()
                     if falsy_literal(p.default) and falsy_literal(value))


def _class_sensitive_with_gates_off(model: FileModel, info: ClassInfo, off: frozenset[str]) -> bool:
    """:func:`class_sensitive` of ``info`` with its forward's ``if gate:``
    blocks (no ``else``, ``gate`` in ``off``) left out, and the attributes
    only those blocks used no longer built."""
    def compute() -> bool:
        forward = info.methods["forward"].node
        dropped = [s for s in walk(forward) if isinstance(s, cst.If) and s.orelse is None
                   and isinstance(s.test, cst.Name) and s.test.value in off]
        if not dropped:
            return True, None
        node = info.node.deep_replace(forward, forward.visit(_Without({id(s) for s in dropped})))
        unused = _attributes_read(model.module.code_for_node(info.node)) \
            - _attributes_read(model.module.code_for_node(node))
        node = node.visit(_Without(set(), unused)) if unused else node
        # ``__init__(self, ..., dropout=0.5)`` whose rate only built the layers left out: it goes too
        node = _without_idle_init_params(model, node, defaults_only=True)
        # the rewritten class is kept with the answer: class_code memoises by node identity
        return _class_sensitive(model, info.name, set(), replace(info, node=node)), node
    return model.cached(("gates-off", id(info.node), off), compute)[0]


def module_method_classes(model: FileModel, call: Call) -> Optional[list[tuple[ClassInfo, str]]]:
    """For ``call`` of a method the file defines on a module class, through an
    instance (``ae.get_code(x)``, ``vae.encode(x)``, a ``predict`` of its own;
    not ``self.m(x)``, not a property, static or class method, not a
    dunder): each ``(class, method name)`` the call may run; ``None`` for any
    other call."""
    recv = call.receiver_text
    if not call.method or not recv or recv.split(".")[0] in ("self", "cls") or call.method.startswith("__"):
        return None
    classes = module_classes(model)
    found = model.resolve_callee(call)
    fn = model.enclosing_function(call.scope)
    if not found and fn is not None and recv in fn.params:  # ``def visual_test(model1, ...)``: what callers pass
        info = model.classes.get(parameter_class(model, fn, recv) or "")
        method = info.methods.get(call.method) if info is not None else None
        found = [method] if method is not None else []
    out = []
    for s in found:
        info = model.classes.get(s.class_name or "")
        if s.kind != "function" or info is None or s.class_name not in classes \
                or not isinstance(s.node, cst.FunctionDef) or _accessor(s.node):
            return None
        out.append((info, s.name))
    return out or None


_RUNS_FORWARD = re.compile(r"\bself\s*(?:\.\s*forward\s*)?\(")
_SWITCHES_MODE = re.compile(r"\bself\s*\.\s*(?:eval|train|requires_grad_)\s*\(")


def method_sensitive(model: FileModel, info: ClassInfo, name: str) -> bool:
    """Whether the method ``name`` of the module class ``info`` may run a layer
    whose forward depends on the mode: :func:`class_sensitive` of the class
    cut down to ``__init__``, the method and the methods it reaches through
    ``self`` (``forward`` too when it calls ``self(x)``), with the attributes
    only the other methods read no longer built (an autoencoder's
    ``get_code`` runs the batch-norm encoder, a ``decode`` that runs only a
    linear head runs none). ``False`` when one of those methods switches
    the mode itself (``self.eval()``)."""
    def compute() -> bool:
        methods = {m: s.node for m, s in info.methods.items() if isinstance(s.node, cst.FunctionDef)}
        if name not in methods:
            return False, None
        reached, todo = {name}, [name]
        while todo:
            code = model.module.code_for_node(methods[todo.pop()])
            more = _attributes_read(code) | ({"forward"} if _RUNS_FORWARD.search(code) else set())
            for m in more & methods.keys() - reached:
                reached.add(m)
                todo.append(m)
        code = "\n".join(model.module.code_for_node(methods[m]) for m in reached)
        if _SWITCHES_MODE.search(code):
            return False, None
        kept = reached | {"__init__", "__post_init__"}
        body = info.node.body
        if not isinstance(body, cst.IndentedBlock):
            return _class_sensitive(model, info.name, set()), None
        node = info.node.with_changes(body=body.with_changes(body=[
            s for s in body.body if not isinstance(s, cst.FunctionDef) or s.name.value in kept]))
        needed = _attributes_read(code)
        stores = [(t.target.attr.value, stmt.value) for fn in (methods.get("__init__"), methods.get("__post_init__"))
                  if fn is not None for stmt in walk(fn) if isinstance(stmt, cst.Assign)
                  for t in stmt.targets if isinstance(t.target, cst.Attribute)
                  and isinstance(t.target.value, cst.Name) and t.target.value.value == "self"]
        grown = True
        while grown:  # ``self.head = nn.Sequential(self.body, ...)``: what a needed attribute is built from
            more = {a for attr, value in stores if attr in needed
                    for a in _attributes_read(model.module.code_for_node(value))}
            grown = not more <= needed
            needed |= more
        unused = {attr for attr, _ in stores} - needed - kept
        node = _without_idle_init_params(model, node.visit(_Without(set(), unused))) if unused else node
        return _class_sensitive(model, info.name, set(), replace(info, node=node)), node
    return model.cached(("method-sensitive", id(info.node), name), compute)[0]


def _without_idle_init_params(model: FileModel, node: cst.ClassDef, defaults_only: bool = False) -> cst.ClassDef:
    """The class ``node`` without the ``__init__`` parameters its body no longer
    uses (only those with a default when ``defaults_only``): a ``base:
    TinyDecoder`` or a ``dropout=0.5`` that only built the attributes left
    out names no layer of what is left."""
    init = next((s for s in node.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)
    if init is None:
        return node
    used = set(re.findall(r"\w+", model.module.code_for_node(init.body)))
    idle = {p.name.value for p in init.params.params[1:]
            if (p.default is not None or not defaults_only) and p.name.value not in used}
    return node.visit(_Without(set(), params=idle)) if idle else node


def _attributes_read(code: str) -> set[str]:
    """The attributes ``code`` reads through ``self`` (``self.x = ...`` alone reads none)."""
    return set(re.findall(r"\bself\s*\.\s*(\w+)\b(?!\s*=(?!=))", code))


class _Without(cst.CSTTransformer):
    """Removes the statements whose ids are in ``gone`` and the one-target
    assignments ``self.<attr> = ...`` of the attributes in ``attrs``, and
    the parameters named in ``params``."""

    def __init__(self, gone: set[int], attrs: "set[str] | frozenset[str]" = frozenset(),
                 params: "set[str] | frozenset[str]" = frozenset()) -> None:
        super().__init__()
        self.gone, self.attrs, self.params = gone, attrs, params

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode):  # type: ignore[override]
        if id(original) in self.gone:
            return cst.RemoveFromParent()
        if isinstance(updated, cst.Param) and updated.name.value in self.params:
            return cst.RemoveFromParent()
        if isinstance(updated, cst.SimpleStatementLine) and len(updated.body) == 1 \
                and isinstance(updated.body[0], cst.Assign) and len(updated.body[0].targets) == 1:
            t = updated.body[0].targets[0].target
            if isinstance(t, cst.Attribute) and isinstance(t.value, cst.Name) and t.value.value == "self" \
                    and t.attr.value in self.attrs:
                return cst.RemoveFromParent()
        return updated


def _built_values(model: FileModel, text: str, bindings: list, functions: bool = False,
                  with_order: bool = False, _depth: int = 0) -> list:
    """The values (unwrapped) of ``bindings`` that build a new object for
    ``text``: not ``model, opt = accelerator.prepare(model, opt)`` (an
    unpacking), ``model = model.to(device)``, ``model = accelerator.prepare(model)``
    (the same module, wrapped) or a pass-through wrapper (``torch.compile``).
    With ``functions`` (the bindings that reach one call, not every binding
    of the name in the file), a lambda counts too (``net, loss = lambda X:
    linreg(X, w, b), squared_loss``: no module there, whatever ``net`` holds
    in other functions)."""
    out = []
    for a in bindings:
        if a.kind in ("assign", "annassign") and a.unpacked:
            out += _unpacked_from_factory(model, a, text, functions, with_order, _depth)
            continue
        if a.kind not in ("assign", "annassign"):
            continue
        value = unwrap(a.value)
        if isinstance(value, cst.Lambda) and not functions:
            continue
        if isinstance(value, (cst.Name, cst.Attribute)) or _rewraps_itself(value, text) \
                or (isinstance(value, cst.Call) and (model.qualname(value.func) or "") in _PASS_THROUGH) \
                or _adapted_without_dropout(model, value) == text:
            continue
        out.append((value, a.order) if with_order else value)
    return out


def _unpacked_from_factory(model: FileModel, a: Assign, text: str, functions: bool, with_order: bool,
                          depth: int = 0) -> list:
    """What ``model, loss_fn, optimizer = get_model()`` binds to ``text``
    when ``get_model`` is a same-file function (the definition the call
    runs) whose every ``return`` is a tuple: the element at ``text``'s
    position, a name followed to its bindings in that function (not to
    every binding of the name in the file); ``[]`` when unknown, and past
    three factories deep (a factory that unpacks a call of itself)."""
    value = unwrap(a.value)
    index = target_element(a, text)
    fns = _live_definitions(model, value) if isinstance(value, cst.Call) and depth <= 2 else None
    if index is None or not fns:
        return []
    out: list = []
    for fn in fns:
        returns = model.returns_of(fn)
        if not returns:
            return []
        for r in returns:
            element = unwrap(r.value) if r.value is not None else None
            if not isinstance(element, cst.Tuple) or index >= len(element.elements) \
                    or isinstance(element.elements[index], cst.StarredElement):
                return []
            item = unwrap(element.elements[index].value)
            if isinstance(item, cst.Name):
                inner = model.reaching_bindings(item.value, r)
                found = _built_values(model, item.value, inner, functions, with_order, depth + 1)
                if not found:
                    return []
                out += found
            else:
                out.append((item, r.order) if with_order else item)
    return out


#: the kinds of mode-dependent layer, each with the tokens that may build one
LAYER_KINDS = {"dropout": _DROPOUT_SOURCE, "statistics": _STATISTICS_SOURCE}


def layer_kinds(model: FileModel, code: str, name: str) -> list[str]:
    """The :data:`LAYER_KINDS` the definition ``name`` (source ``code``) may
    hold by its own code and same-file classes (names it takes from other
    files are asked of ``model.project``, which records them)."""
    return [kind for kind in LAYER_KINDS if not _code_free_of(model, code, kind, {name})]


def _code_free_of(model: FileModel, code: str, kind: str, seen: set[str]) -> bool:
    """Whether ``code`` (and the same-file classes it names) spells nothing
    that may build a layer of ``kind`` (:data:`LAYER_KINDS`; a zero dropout
    rate aside) and names no layer from
    outside torch and the standard/numeric libraries that the project index
    (when the file has one) cannot show to be free of that kind of layer."""
    code = _TYPE_TEST.sub("isinstance()", _PROSE.sub("", code))
    if spells_mode_layer(model, _ZERO_DROPOUT.sub("", code), LAYER_KINDS[kind]):
        return False
    project = model.project
    for word in set(re.findall(r"\b[A-Za-z_][A-Za-z0-9_]*\b", code)):
        if word in model.classes and word not in seen:
            seen.add(word)
            if not _code_free_of(model, class_code(model, model.classes[word]), kind, seen):
                return False
        target = model.names.aliases.get(word)
        if target and target.split(".")[0] not in ("torch", *_STD_MODULES, *_NUMERIC_MODULES):
            if _may_build(code, word) and (project is None or not project.free_of(target, kind)):
                return False  # a layer or factory from another package: not visible
        elif target is None and project is not None and project.imports_relatively(word) \
                and _may_build(code, word) and not project.free_of(word, kind):
            return False
    return True


# -- mode events -----------------------------------------------------------------
def _owner_of(owner: str, text: str) -> bool:
    return text == owner or text.startswith(owner + ".")


def _train_flag(call: Call) -> Optional[str]:
    arg = call.arg(0, "mode")
    if arg is None or is_literal(arg, True):
        return TRAIN
    if is_literal(arg, False):
        return EVAL
    return UNKNOWN


def map_into(model: FileModel, call: Call, callee: Scope, text: str) -> Optional[str]:
    """The name ``text`` (in the caller) takes inside ``callee`` when
    ``call`` invokes it: the parameter it is passed as, the same ``self.x``
    for a ``self.f(...)`` method call, or the same global name when the
    callee neither takes nor binds it. ``None`` when it does not reach."""
    head = text.split(".")[0]
    positional = [a for a in call.node.args if a.keyword is None and not a.star]
    params = call_params(call, callee)
    for i, a in enumerate(positional):
        if dotted_name(a.value) == text and i < len(params):
            return params[i]
    for a in call.node.args:
        if a.keyword is not None and dotted_name(a.value) == text and a.keyword.value in callee.params:
            return a.keyword.value
    if head == "self":
        if call.func_text and call.func_text.startswith("self.") and callee.class_name is not None:
            return text
        return None
    if head in callee.params or model.bindings_of(head, callee):
        return None
    return text


def map_out(model: FileModel, call: Call, callee: Scope, text: str) -> Optional[str]:
    """The caller-side name of ``text`` (a name inside ``callee``) at the
    call site ``call``, or ``None`` when it cannot be told."""
    head, _, rest = text.partition(".")
    if head == "self":
        if call.func_text and call.func_text.startswith("self.") and callee.class_name is not None:
            return text
        return None
    if head in callee.params:
        name = dotted_name(argument_for(call, callee, head))
        if name is None:
            return None
        return f"{name}.{rest}" if rest else name
    if model.bindings_of(head, callee):
        return None
    return text


def _forwards(model: FileModel, scope: Scope, text: str, depth: int) -> bool:
    """Whether ``scope`` runs a forward of ``text`` with grad not disabled
    (directly or through a same-file helper it passes the module to)."""
    memo = _cache(model).forwards
    key = (id(scope), text)
    if key not in memo:
        memo[key] = False  # recursion guard
        memo[key] = _forwards_uncached(model, scope, text, depth)
    return memo[key]


def _forwards_uncached(model: FileModel, scope: Scope, text: str, depth: int) -> bool:
    for c in model.calls_within(scope.order, scope.end):
        if c.func_text in (text, f"{text}.forward") and model.grad_mode(c) is not GradMode.DISABLED:
            return True
        if depth < _MAX_DEPTH and c.scope is scope:
            callees = model.resolve_callee(c)
            for callee in callees:
                inner = map_into(model, c, callee, text)
                if callee is not scope and inner and _forwards(model, callee, inner, depth + 1):
                    return True
            if model.grad_mode(c) is not GradMode.DISABLED and _handed_to_unknown(model, c, (text,), callees):
                return True  # handed to an unknown function (``compute_loss(policy, batch)``) that runs it
    return False


def _handed_to_unknown(model: FileModel, call: Call, names: tuple[str, ...],
                       callees: Optional[list[Scope]] = None) -> bool:
    """Whether ``call`` passes one of ``names`` (a module) to a function the
    file does not define (``compute_loss(policy, batch)``,
    ``train_epoch(model, loader)``), which may run or train it; the
    module's own API and wrappers (``.to()``, ``.eval()``) excepted.
    ``callees``: :meth:`FileModel.resolve_callee` of ``call``, when known."""
    if callees is None:
        callees = model.resolve_callee(call)
    return not callees and call.method not in _MODULE_METHODS | _WRAPPERS \
        and any(dotted_name(a.value) in names for a in call.node.args)


def _self_is_module(model: FileModel, call: Call) -> bool:
    """``self.train()`` switches submodules only when ``self`` is a module."""
    if call.receiver_text != "self":
        return False
    fn = model.enclosing_function(call.scope)
    return fn is not None and fn.class_name in module_classes(model)


def _switched_while_grad_disabled(model: FileModel, call: Call, recv: str, text: str) -> bool:
    """Whether ``call`` (``recv.train(...)``/``recv.eval()``) runs with grad
    disabled and either puts module ``text`` (or an owner) in training mode
    or switches a strict submodule of ``text`` (``text.part.eval()``)."""
    if model.grad_mode(call) is not GradMode.DISABLED:
        return False
    if recv.startswith(text + "."):
        return True
    if call.method == "train" and recv == text and _restores_on_exit(model, call, text):
        return False  # a helper handing the module back in training mode, whatever its caller does
    return call.method == "train" and _owner_of(recv, text) and _train_flag(call) == TRAIN \
        and (recv == text or is_module(model, recv) or _self_is_module(model, call))


def _restores_on_exit(model: FileModel, call: Call, text: str) -> bool:
    """Whether ``call`` (``text.train()``) restores training mode on the way
    out of a helper that switched its parameter ``text`` to eval: after a
    ``text.eval()`` of the same function, outside its loops, with no forward
    of ``text`` after it in the function. TRADES's ``perturb_logistic(net,
    x)`` (``net.eval()``, an attack, ``net.train()``) serves the training
    loop; an evaluation under ``no_grad`` that calls it then runs the model
    in training mode. Not a switch made for the forwards that follow it (a
    batch-norm recalibration, Monte-Carlo dropout, torchvision's losses)."""
    fn = model.enclosing_function(call.scope)
    if fn is None or text.split(".")[0] not in fn.params:
        return False
    loop = call.loop
    if loop is not None and loop.order >= fn.order:
        return False
    inside = model.calls_within(fn.order, fn.end)
    return any(c.order < call.order and c.receiver_text == text and c.method == "eval" for c in inside) \
        and not any(c.order > call.order and (c.func_text == text or c.receiver_text == text
                                               and c.method in FORWARD_METHODS) for c in inside)


def _trains(model: FileModel, call: Call) -> bool:
    if optimizer_step(model, call) is not None:
        return True
    b = backward_call(model, call)
    return b is not None and b.accumulates and not _input_gradients(model, call.scope)


def _input_gradients(model: FileModel, scope: Scope) -> bool:
    """Whether ``scope`` backpropagates for the gradient of an input, not to
    train: it marks a tensor ``requires_grad`` (``x.requires_grad = True``,
    ``x.requires_grad_()``, not on a module or parameters) and steps no
    optimizer, as an adversarial attack (FGSM, ODIN's perturbation) or a
    saliency map does; the gradient of that tensor (``x.grad``) is read in the scope."""
    def compute() -> bool:
        marked: set[str] = set()
        for a in model.assigns_in_scope(scope):
            for t in a.targets:
                if t.kind == "attr" and (t.text or "").endswith(".requires_grad") and is_literal(a.value, True):
                    marked.add(t.text.rsplit(".", 1)[0])
        for c in model.calls_in_scope(scope):
            if optimizer_step(model, c) is not None:
                return False
            recv = c.receiver_text or ""
            if c.method == "requires_grad_" and recv and not is_module(model, recv) \
                    and not (c.node.args and is_literal(c.node.args[0].value, False)):
                marked.add(recv)
        if not marked:
            return False
        code = model.module.code_for_node(scope.node)
        return any(re.search(rf"(?<![\w.]){re.escape(name)}\.grad\b", code) for name in marked)
    return model.memoised(_input_gradients, id(scope), compute)


def events(model: FileModel, scope: Scope, text: str, depth: int = 0) -> list[ModeEvent]:
    """Mode events of the module ``text`` in ``scope``'s own statements, in
    source order (see the module docstring). ``TRAINED`` events that follow
    an ``EVAL`` (training in eval mode on purpose) are dropped."""
    key = (id(scope), text, depth)
    c = _cache(model)
    if key in c.events:
        return c.events[key]
    c.events[key] = []  # recursion guard
    raw = _own_events(model, scope, text, depth)
    for alias in _alias_group(model, scope, text):
        # ``model = context.model``: the events of the alias are the module's
        seen = {id(e.call) for e in raw}
        raw += [e for e in _own_events(model, scope, alias, depth) if id(e.call) not in seen]
    raw.sort(key=lambda e: e.order)
    out: list[ModeEvent] = []
    last_explicit: Optional[str] = None
    for e in raw:
        if e.kind == TRAINED and last_explicit == EVAL:
            continue
        if e.kind != TRAINED:
            last_explicit = e.kind
        out.append(e)
    c.events[key] = out
    return out


def _own_events(model: FileModel, scope: Scope, text: str, depth: int) -> list[ModeEvent]:
    """The mode events of ``text`` itself in ``scope`` (its aliases' aside), unsorted."""
    raw: list[ModeEvent] = []
    used: Optional[bool] = None
    built = _constructions(model, scope, text)
    built.update(_pretrained_loads(model, scope, text))
    for call in model.calls_in_scope(scope):
        if id(call.node) in built:
            raw.append(ModeEvent(call, built[id(call.node)]))
            continue
        callees = model.resolve_callee(call)
        recv = call.receiver_text
        if not callees and recv and recv not in ("cls",) and call.method in ("eval", "train") \
                and _switched_while_grad_disabled(model, call, recv, text):
            # A mode switch made while gradients are off is an evaluation-time
            # choice: ``m.train()`` on purpose (torchvision detection losses,
            # a BN recalibration pass) or ``m.head.eval()`` on a part of the
            # module (the author manages the parts' modes): intent unknown.
            raw.append(ModeEvent(call, UNKNOWN))
            continue
        if not callees and recv and recv not in ("cls",) and call.method in ("eval", "train") \
                and _owner_of(recv, text):
            if call.method == "eval" and not call.node.args:
                raw.append(ModeEvent(call, EVAL))
            elif call.method == "train" and (recv == text or is_module(model, recv) or _self_is_module(model, call)):
                raw.append(ModeEvent(call, _train_flag(call)))
            continue
        managed = MODULE_MODE_MANAGERS.get(call.qualname or "")
        if managed and any(dotted_name(a.value) == text for a in call.node.args):
            # ``with eval_mode(model):`` (MONAI): the mode for the block, the module's own after it
            raw.append(ModeEvent(call, EVAL if managed == "eval" else TRAIN))
            region = next((r for r in model.regions if r.kind == "with" and r.node is call.statement), None)
            if region is not None and region.end > call.order:
                raw.append(ModeEvent(replace(call, order=region.end), UNKNOWN))
            continue
        if _trains(model, call):
            if used is None:
                used = _forwards(model, scope, text, depth)
            if used:
                raw.append(ModeEvent(call, TRAINED))
            continue
        if depth < _MAX_DEPTH:
            for callee in callees:
                inner = map_into(model, call, callee, text)
                if callee is scope or inner is None:
                    continue
                sub = events(model, callee, inner, depth + 1)
                if sub:
                    kind = sub[-1].kind
                    if kind == TRAINED and sub[0].kind in (TRAIN, HELPER_TRAIN) \
                            and all(e.kind != EVAL for e in sub):
                        kind = TRAIN  # ``train_epoch()`` calls ``model.train()`` itself before it trains
                    raw.append(ModeEvent(call, HELPER_TRAIN if kind in (TRAIN, HELPER_TRAIN) else kind))
                    break
    return raw


def same_module(node: Optional[cst.BaseExpression], model: Optional[FileModel] = None) -> Optional[str]:
    """The dotted name of the module ``node`` gives back itself: ``net``,
    ``context.model``, or through methods that return their module
    (``self.train()``, ``net.to(device)``); with ``model`` (the file, to
    resolve callees) also through a wrapper whose forward and mode are the
    module's (``DDP(model, device_ids=[rank])``, ``torch.compile(model)``:
    :data:`_PASS_THROUGH`, the module its first argument); else ``None``."""
    node = unwrap(node, MODULE_RETURNING_METHODS)
    if model is not None and isinstance(node, cst.Call) and node.args and node.args[0].keyword is None \
            and not node.args[0].star and (model.qualname(node.func) or "") in _PASS_THROUGH:
        return same_module(node.args[0].value, model)
    return dotted_name(node) if node is not None else None


def _aliases(model: FileModel, scope: Scope, text: str) -> set[str]:
    """Names that ``scope`` binds to exactly ``text`` (``model =
    context.model``, ``model = self.train()``, ``ddp_model = DDP(model,
    ...)``), and only to it."""
    out: set[str] = set()
    for a in model.assigns_in_scope(scope):
        if a.kind == "assign" and not a.unpacked and len(a.targets) == 1 and a.targets[0].text \
                and same_module(a.value, model) == text and a.targets[0].text != text:
            name = a.targets[0].text
            if all(b is a for b in model.bindings_of(name, scope) if b.kind != "param"):
                out.add(name)
    return out


def _alias_group(model: FileModel, scope: Scope, text: str) -> set[str]:
    """The other names ``scope`` holds the module ``text`` under: its
    aliases (:func:`_aliases`), and when ``text`` is itself an alias (its
    one binding in ``scope`` is ``ddp_model = DDP(model, ...)``) the module
    it names and that module's other aliases; ``model.eval()`` switches
    what ``ddp_model(x)`` runs."""
    group = _aliases(model, scope, text)
    own = [b for b in model.bindings_of(text, scope) if b.kind != "param"]
    if len(own) == 1 and own[0].kind == "assign" and not own[0].unpacked and len(own[0].targets) == 1:
        target = same_module(own[0].value, model)
        if target is not None and target != text:
            group |= {target} | _aliases(model, scope, target)
    return group - {text}


def modes_at(model: FileModel, call: Call, text: str, depth: int = 0) -> frozenset[str]:
    """The event kinds that may be the latest for module ``text`` when
    ``call`` runs; empty when nothing is known.

    Within the call's scope the latest earlier event in the innermost loop
    decides, and when that event may not run before the call (it sits in a
    branch the call is not in: ``if epoch % k == 0: model.eval()`` before
    a final test after the epoch loop) so may the events before it, back
    to one that always runs; if that loop body has none before the call,
    both the state on loop entry and the loop body's last event after the
    call (the previous iteration) may reach it. On function entry the
    same-file callers are asked (``depth`` bounds the recursion).
    """
    key = (id(call), text, depth)
    c = _cache(model)
    if key in c.modes:
        return c.modes[key]
    c.modes[key] = frozenset()  # recursion guard
    evs = events(model, call.scope, text)
    loops = call.loops

    def reach(pos: int, idx: int) -> frozenset[str]:
        lo = loops[idx].order if idx >= 0 else call.scope.order
        prior = [e for e in evs if lo <= e.order < pos]
        kinds: set[str] = set()
        for e in reversed(prior):
            if model.exclusive(e.call, call):
                continue  # the other branch of an ``if`` the call is in
            if _always_before(model, e, call, text):
                return frozenset(kinds | {e.kind})
            choice = _branch_choice(model, e, prior, call, text)
            if choice is not None:
                return frozenset(kinds | {choice})
            kinds.add(e.kind)
        if idx < 0:
            return frozenset(kinds) | _entry_modes(model, call.scope, text, depth)
        loop = loops[idx]
        child_end = call.order if idx == len(loops) - 1 else loops[idx + 1].end
        tail = [e for e in evs if child_end < e.order <= loop.end and not _leaves_loop_after(e.call)]
        entry = reach(loop.order, idx - 1)
        return frozenset(kinds) | entry | ({tail[-1].kind} if tail else set())

    result = reach(call.order, len(loops) - 1)
    c.modes[key] = result
    return result


def _always_before(model: FileModel, event: ModeEvent, then: Call, text: str, also: tuple = ()) -> bool:
    """Whether the mode ``event`` sets holds whenever ``then`` (a call of
    module ``text``) runs after it: the event is earlier in the same scope,
    in no branch (of an ``if``, a ``try``...) that does not also hold
    ``then``. ``with`` bodies count as the suite around them, and so do loop
    bodies (a loop is taken to run at least once, as :func:`modes_at` does),
    the body of ``if text is not None:`` / ``if text:`` / ``if
    isinstance(text, nn.Module):`` (otherwise ``then`` cannot call a module
    there), for an ``eval()``, the body of ``if text.training:``
    (``was_training = net.training; if was_training: net.eval()``: otherwise
    it is in eval mode already), and the suites ``also``."""
    first = event.call
    if first.scope is not then.scope or first.order >= then.order:
        return False
    straight = set(model.with_bodies) | {id(getattr(lp.node, "body", None)) for lp in (*first.loops, *then.loops)}
    for parent in first.blocks:
        for stmt in getattr(parent, "body", ()):
            if not isinstance(stmt, cst.If):
                continue
            if _tests_present(stmt.test, text) or _tests_module(model, stmt.test, text) \
                    or (event.kind == EVAL and _tests_training(model, stmt.test, text, first)):
                straight.add(id(stmt.body))
    straight.update(id(b) for b in also)
    mine = [b for b in first.blocks if id(b) not in straight]
    theirs = [b for b in then.blocks if id(b) not in straight]
    return len(mine) <= len(theirs) and all(a is b for a, b in zip(mine, theirs))


def _tests_training(model: FileModel, test: cst.BaseExpression, text: str, at: Call) -> bool:
    """``text.training`` as an ``if`` test, directly or through a name whose
    binding that reaches ``at`` is ``text.training``."""
    if dotted_name(test) == f"{text}.training":
        return True
    if isinstance(test, cst.Name):
        bindings = model.reaching_bindings(test.value, at)
        return bool(bindings) and all(b.kind == "assign" and b.value is not None
                                      and dotted_name(b.value) == f"{text}.training" for b in bindings)
    return False


def _tests_module(model: FileModel, test: cst.BaseExpression, text: str) -> bool:
    """``isinstance(text, nn.Module)`` as an ``if`` test."""
    return isinstance(test, cst.Call) and dotted_name(test.func) == "isinstance" and len(test.args) == 2 \
        and dotted_name(test.args[0].value) == text \
        and model.qualname(test.args[1].value) in ("torch.nn.Module", "torch.nn.modules.module.Module")


def _branch_choice(model: FileModel, event: ModeEvent, prior: list, then: Call, text: str) -> Optional[str]:
    """When ``event`` sits in a branch of an ``if``/``elif``/``else`` chain
    with an ``else``, not around ``then``, whose every branch sets the
    module's mode (``if training: model.train() else: model.eval()``, the
    flag's choice), and that chain runs whenever ``then`` runs: the mode it
    leaves (:data:`UNKNOWN` when the branches differ); else ``None``."""
    for stmt, _ in enclosing_ifs(event.call):
        branches = if_branches(stmt)
        chain = stmt
        while isinstance(chain.orelse, cst.If):
            chain = chain.orelse
        if not isinstance(chain.orelse, cst.Else) or any(b is x for b in branches for x in then.blocks):
            return None
        kinds = set()
        for branch in branches:
            last = [e for e in prior if any(b is branch for b in e.call.blocks)]
            if not last:
                return None
            kinds.add(last[-1].kind)
        if not _always_before(model, event, then, text, also=tuple(branches)):
            return None
        return kinds.pop() if len(kinds) == 1 else UNKNOWN
    return None


def _tests_present(test: cst.BaseExpression, text: str) -> bool:
    """``text is not None`` or ``text`` itself as an ``if`` test."""
    if dotted_name(test) == text:
        return True
    return isinstance(test, cst.Comparison) and dotted_name(test.left) == text and len(test.comparisons) == 1 \
        and isinstance(test.comparisons[0].operator, cst.IsNot) \
        and isinstance(test.comparisons[0].comparator, cst.Name) and test.comparisons[0].comparator.value == "None"


def switched_to_training_for(model: FileModel, call: Call, text: str) -> bool:
    """Whether module ``text`` is in training mode at ``call`` only because
    an explicit ``text.train()`` put it there for sampling, with no training
    after it: Monte-Carlo dropout (``net.train()``, then the net run several
    times on one input under ``no_grad``).

    True when :func:`_untrained_switch` finds that switch and the module is
    sampled several times on one input (:func:`_samples_one_input`): a
    ``.train()`` followed by a single evaluation or a pass over data is no
    such switch."""
    switch = _untrained_switch(model, call, text)
    return switch is not None and _samples_one_input(model, call, switch)


def _untrained_switch(model: FileModel, call: Call, text: str) -> Optional[int]:
    """The order of the explicit ``text.train()`` in ``call``'s scope that is
    the only mode that may reach ``call``, when from it to the module's next
    mode switch (or the end of the innermost loop around it, or of the
    scope) no backward or optimizer step runs, no same-file helper trains
    the module and no unknown function is handed the module (it might train
    it); else ``None``. A ``.train()`` at the top of an epoch that trains
    after the evaluation is no such switch."""
    if modes_at(model, call, text) != frozenset({TRAIN}):
        return None
    evs = events(model, call.scope, text)
    before = [e for e in evs if e.order < call.order]
    if not before or before[-1].kind != TRAIN:
        return None
    switch = before[-1]
    loop = switch.call.loop
    end = loop.end if loop is not None else call.scope.end
    for e in evs:
        if e.order <= switch.order or e.order > end:
            continue
        if e.kind in (TRAINED, HELPER_TRAIN):
            return None
        if e.order > call.order:
            end = e.order  # the next switch: what follows is no longer this one's business
            break
    names = (text, text.split(".")[0])
    for c in model.calls_within(switch.order, end):
        if _trains(model, c) or (c.func_text != text and _handed_to_unknown(model, c, names)):
            return None  # trained, or handed to a function that might train it (``train_epoch(model, loader)``)
    return switch.order


_COMPREHENSIONS = (cst.ListComp, cst.GeneratorExp, cst.SetComp, cst.DictComp)


def _samples_one_input(model: FileModel, call: Call, after: int) -> bool:
    """Whether ``call`` runs its module several times on one input: inside a
    comprehension, or a loop entered after ``after``, that rebinds no name
    its arguments read (``[net(x) for _ in range(T)]``; not ``for x in
    loader: net(x)``, an evaluation pass over data)."""
    read = set().union(*(names_in(a.value) for a in call.node.args))
    for comp in walk(call.statement):
        if isinstance(comp, _COMPREHENSIONS) and any(n is call.node for n in walk(comp)):
            targets: set[str] = set()
            clause: Optional[cst.CompFor] = comp.for_in
            while clause is not None:
                targets |= names_in(clause.target)
                clause = clause.inner_for_in
            return not read & targets
    loop = call.loop
    if loop is None or loop.order < after:
        return False
    rebound = {t.text for a in model.assigns_within(loop.order, loop.end) for t in a.targets if t.text}
    return not read & rebound


_EXITS = (cst.Return, cst.Raise, cst.Break)


def _leaves_loop_after(call: Call) -> bool:
    """Whether the block holding ``call`` ends the iteration after it for
    good: a later statement of that block is a ``return``, ``raise`` or
    ``break`` (``self.net.train(); return None`` in an early exit of a
    validation loop: that switch never precedes the next iteration)."""
    if not call.blocks:
        return False
    body = getattr(call.blocks[-1], "body", None)
    if not isinstance(body, (list, tuple)):
        return False
    after = False
    for stmt in body:
        for small in stmt.body if isinstance(stmt, cst.SimpleStatementLine) else (stmt,):
            if after and isinstance(small, _EXITS):
                return True
            after = after or small is call.statement
    return False


def _entry_modes(model: FileModel, scope: Scope, text: str, depth: int) -> frozenset[str]:
    if scope.kind != "function" or depth >= _MAX_DEPTH:
        return frozenset()
    out: set[str] = set()
    callers = model.callers_of(scope)
    for site in callers:
        outer = map_out(model, site, scope, text)
        if outer is not None:
            out |= modes_at(model, site, outer, depth + 1)
    if not callers and text.startswith("self."):
        out |= _attribute_state(model, scope, text)
    return frozenset(out)


def _constructions(model: FileModel, scope: Scope, text: str) -> dict[int, str]:
    """Constructor calls in ``scope`` that bind ``text`` to a new module,
    each with the mode it starts in: a module is constructed in training mode
    (``BUILT``) unless the same expression puts it in eval mode
    (``Net().eval()``). ``from_pretrained`` loaders are not constructors here:
    transformers and diffusers return their models in eval mode."""
    out: dict[int, str] = {}
    for a in model.bindings_of(text, scope):
        if a.kind in ("assign", "annassign") and a.unpacked and _factory_builds_fresh(model, a, text):
            out[id(unwrap(a.value))] = BUILT  # ``model, loss_fn, opt = get_model()``
            continue
        if a.kind not in ("assign", "annassign") or a.unpacked or constructor_kind(model, a.value) is None:
            continue
        inner = unwrap(a.value)
        if isinstance(inner, cst.Call) and (model.qualname(inner.func) or "") in _PASS_THROUGH:
            continue  # ``DataParallel(model)``: a wrapper keeps the wrapped module's mode
        kind = BUILT
        node = a.value
        while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                and node.func.attr.value in _WRAPPERS:
            if node.func.attr.value == "eval" or (node.func.attr.value == "train" and node.args
                                                  and is_literal(node.args[0].value, False)):
                kind = EVAL
                break
            node = node.func.value
        ctor = unwrap(a.value)
        if isinstance(ctor, cst.Call):
            out[id(ctor)] = kind
    return out


def _factory_builds_fresh(model: FileModel, a: Assign, text: str) -> bool:
    """Whether the unpacking ``a`` (``model, loss_fn, opt = get_model()``)
    binds ``text`` to a module the same-file factory constructs, in training
    mode: every definition the call runs returns a constructor call at that
    position and switches no mode."""
    value = unwrap(a.value)
    fns = _live_definitions(model, value) if isinstance(value, cst.Call) else None
    built = _unpacked_from_factory(model, a, text, False, False) if fns else []
    return bool(built) and all(constructor_kind(model, v) is not None for v in built) and not any(
        c.method in ("eval", "train") for fn in fns for c in model.calls_within(fn.order, fn.end))


def _pretrained_loads(model: FileModel, scope: Scope, text: str) -> dict[int, str]:
    """``model = Cls.from_pretrained(...)`` in ``scope`` (through ``.to(device)``-style calls):
    transformers, diffusers and PEFT return the loaded model in eval mode
    (``PreTrainedModel.from_pretrained``: "The model is set in evaluation mode by default
    using ``model.eval()``"), so the rebinding is an ``EVAL`` event that ends whatever
    training the name saw before (a notebook reloading its fine-tuned model); with
    ``is_trainable=True`` (a PEFT adapter to train) it is ``UNKNOWN``. A part of what was
    loaded (``image_pipe.unet`` of ``image_pipe = DDPMPipeline.from_pretrained(...)``: a
    diffusers pipeline loads each model it holds in eval mode) counts the same."""
    out: dict[int, str] = {}
    parts = text.split(".")
    owners = [".".join(parts[:n]) for n in range(1, len(parts))]
    for a in [b for t in (text, *owners) for b in model.bindings_of(t, scope)]:
        if a.kind not in ("assign", "annassign") or a.unpacked:
            continue
        node = unwrap(a.value)
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                and node.func.attr.value == "from_pretrained":
            trainable = next((arg.value for arg in node.args if arg.keyword and arg.keyword.value == "is_trainable"),
                             None)
            out[id(node)] = EVAL if trainable is None or is_literal(trainable, False) else UNKNOWN
    return out


def _attribute_state(model: FileModel, scope: Scope, text: str) -> frozenset[str]:
    """The mode a module attribute ``self.x`` may be in when a method with
    no same-file caller (``forward``, a hook, an agent's ``act``) starts:
    the mode its construction in the class left it in, when no code of the
    file ever switches it (an ``.eval()`` in setup code counts as a switch).

    Two constructions are evidence: a pretrained backbone from a model zoo,
    and any module built by a plain class (one that is no ``nn.Module``,
    whose bases are all same-file plain classes: a trainer, a tester, an
    agent). A submodule of an ``nn.Module`` follows the mode its caller sets
    on the parent; a plain class's module is switched only by calls on it,
    so with none that may put it in eval mode anywhere in the file (and no
    ``.eval()`` on a computed receiver, ``getattr(self, name).eval()``, or
    on a loop variable, in the class) it is in training mode wherever the
    class uses it."""
    fn = model.enclosing_function(scope)
    if fn is None or fn.class_name is None:
        return frozenset()
    info = model.classes.get(fn.class_name)
    if info is None:
        return frozenset()
    kinds: set[str] = set()
    zoo = False
    for method in info.methods.values():
        kinds |= set(_constructions(model, method, text).values())
        zoo = zoo or any(a.kind in ("assign", "annassign") and constructor_kind(model, a.value) == "zoo"
                         for a in model.bindings_of(text, method))
    if kinds != {BUILT}:
        return frozenset()
    plain = not zoo and _plain_class(model, info.name)
    if not zoo and not plain:
        return frozenset()
    attr = text.split(".", 1)[1]
    cls_scope = next((sc for sc in model.scopes if sc.kind == "class" and sc.node is info.node), None)
    for call in model.calls:
        recv = call.receiver_text or ""
        if call.method in ("eval", "train", "requires_grad_") and (recv == text or recv.endswith("." + attr)):
            if plain and call.method == "train" and _to_training(call):
                continue  # ``self.net.train()``: still training mode
            return frozenset()  # switched somewhere: the mode at this point cannot be told
        if plain and call.method in ("eval", "train") and cls_scope is not None and cls_scope.contains(call.order) \
                and not _to_training(call) and _unclear_receiver(model, call):
            return frozenset()  # ``for net in self.nets: net.eval()``: may be this module
    return frozenset({BUILT})


def _to_training(call: Call) -> bool:
    """``m.train()`` / ``m.train(True)``: a switch to training mode."""
    args = call.node.args
    return call.method == "train" and (not args or len(args) == 1 and is_literal(args[0].value, True))


def _unclear_receiver(model: FileModel, call: Call) -> bool:
    """Whether the receiver of a mode switch may be any module: computed
    (``getattr(self, "net" + name)``, ``self.nets[i]``) or a name not bound
    to a ``self`` attribute (a loop variable, a parameter)."""
    recv = call.receiver_text
    if not recv:
        return True
    if recv.startswith("self."):
        return False
    bindings = model.reaching_bindings(recv.split(".")[0], call)
    return not bindings or any(not (b.kind in ("assign", "annassign") and not b.unpacked
                                    and (dotted_name(b.value) or "").startswith("self.")) for b in bindings)


def _plain_class(model: FileModel, name: str, depth: int = 0) -> bool:
    """Whether the same-file class ``name`` is no ``nn.Module``: it has no
    bases but ``object`` and same-file plain classes."""
    info = model.classes.get(name)
    if info is None or depth > 5 or name in module_classes(model):
        return False
    return all(b == "object" or (b in model.classes and _plain_class(model, b, depth + 1)) for b in info.bases)


def may_be_training(model: FileModel, call: Call, text: str) -> bool:
    """Whether evidence says module ``text`` may be in training mode at
    ``call`` (trained or ``.train()``-ed without ``.eval()`` in between)."""
    kinds = modes_at(model, call, text)
    if kinds == {BUILT} and _in_unit_test(model, call):
        # A unit test that only constructs the module compares forwards of
        # random weights (train mode on purpose, or the same mode on both
        # sides); only weights worth evaluating make it an evaluation.
        return _has_weights(model, call, text)
    return bool(kinds & TRAINING_KINDS)


def _in_unit_test(model: FileModel, call: Call) -> bool:
    """Whether ``call`` runs in a pytest/unittest test function (``test*``)."""
    fn = model.enclosing_function(call.scope)
    while fn is not None:
        if fn.name.startswith("test"):
            return True
        fn = model.enclosing_function(fn.parent) if fn.parent is not None else None
    return False


_LOADERS = frozenset({"load_state_dict", "load_checkpoint", "load_weights", "load_pretrained", "from_pretrained"})


def _has_weights(model: FileModel, call: Call, text: str) -> bool:
    """Whether the module ``text`` may hold trained weights where ``call``
    runs: built by a model-zoo factory, given a state dict or checkpoint in
    the file, or a parameter whose same-file callers pass such a module
    (unknown callers count as having weights)."""
    fn = model.enclosing_function(call.scope)
    root = text.split(".")[0]
    if fn is not None and _parameter_rooted(model, fn, call.scope, text):
        outer = _caller_pairs(model, fn, text)
        return not outer or any(_has_weights(model, s, o) for s, o in outer)
    for a in model.assigns:
        if a.binds(text) and (constructor_kind(model, a.value) == "zoo" or isinstance(a.value, cst.Call) and (
                model.qualname(a.value.func) or "") in ("torch.load", "torch.hub.load", "torch.jit.load")):
            return True
    return any(c.method in _LOADERS and (c.receiver_text or "").split(".")[0] == root for c in model.calls)


def _caller_names(model: FileModel, scope: Scope, text: str) -> set[str]:
    """Caller-side names of a parameter-rooted ``text`` at same-file call sites."""
    if text.split(".")[0] not in scope.params:
        return set()
    return {o for _, o in _caller_pairs(model, scope, text)}


def _caller_pairs(model: FileModel, fn: Scope, text: str) -> list[tuple[Call, str]]:
    """Each same-file call site of ``fn`` where the parameter-rooted ``text``
    maps to a caller-side name, with that name (:func:`map_out`)."""
    return [(site, o) for site in model.callers_of(fn) if (o := map_out(model, site, fn, text))]


def _parameter_rooted(model: FileModel, fn: Scope, scope: Scope, text: str) -> bool:
    """Whether ``text`` is rooted at a parameter of ``fn`` that ``scope`` never rebinds."""
    root = text.split(".")[0]
    return root in fn.params and all(b.kind == "param" for b in model.bindings_of(root, scope))


def is_module_at(model: FileModel, call: Call, text: Optional[str]) -> bool:
    """Whether ``text`` holds a module where ``call`` runs: a known module
    name, or a parameter that same-file callers fill with a known module."""
    if not text or _not_a_module_here(model, call, text):
        return False
    if is_module(model, text):
        return True
    if MODULE_NAME.match(text.rsplit(".", 1)[-1]) and ("." not in text or text.startswith("self.")) \
            and not model.bindings_of(text, model.module_scope) and not _def_in_reach(model, call.scope, text) \
            and _trained_anywhere(model, text):
        return True  # ``model`` / ``self.net`` that a training step in this file runs
    fn = model.enclosing_function(call.scope)
    return fn is not None and any(is_module(model, o) for o in _caller_names(model, fn, text))


def _def_in_reach(model: FileModel, scope: Scope, name: str) -> bool:
    """Whether ``name`` is a function defined in ``scope`` or a scope around
    it, the module included (a top-level ``def net(X)``, a closure such as
    ``def apply_model(x): return model(x)`` inside the training function): a
    function, not a module, whatever its name."""
    around = set()
    s: Optional[Scope] = scope
    while s is not None:
        around.add(id(s))
        s = s.parent
    return any(f.kind == "function" and f.name == name and id(f.parent) in around for f in model.scopes)


def _not_a_module_here(model: FileModel, call: Call, text: str) -> bool:
    """Whether ``call`` sits where an ``isinstance`` test has ruled out that
    ``text`` is a module: the ``else`` of ``if isinstance(text,
    nn.Module):``, or the body of ``if not isinstance(text, nn.Module):``
    (d2l's ``evaluate_accuracy`` also takes a from-scratch function)."""
    for stmt, inner in enclosing_ifs(call):
        test, negated = stmt.test, False
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            test, negated = test.expression, True
        if _tests_module(model, test, text) and inner is (
                stmt.body if negated else (stmt.orelse.body if isinstance(stmt.orelse, cst.Else) else None)):
            return True
    return False


def _defined_functions(model: FileModel) -> frozenset[str]:
    """Names the file's top level binds with ``def`` (``def net(X)``: a
    from-scratch model is a function, not a module, whatever its name)."""
    return model.cached("defined_functions", lambda: frozenset(
        s.name for s in model.scopes if s.kind == "function" and s.parent is model.module_scope))


def _trained_anywhere(model: FileModel, text: str) -> bool:
    """Whether some scope of the file runs ``text``'s forward and trains
    (a backward or an optimizer step in the same scope)."""
    return any(e.kind == TRAINED for s in model.scopes if s.kind in ("module", "function")
               for e in events(model, s, text))


def mode_sensitive_at(model: FileModel, call: Call, text: str, depth: int = 0) -> bool:
    """:func:`mode_sensitive` for ``text`` where ``call`` runs, looking
    through a parameter to the modules its same-file callers pass (what
    reaches each call site decides: ``evaluate_loss(net, ...)`` from a
    function where ``net`` is a lambda passes no module)."""
    fn = model.enclosing_function(call.scope)
    if fn is not None and depth < _MAX_DEPTH and _parameter_rooted(model, fn, call.scope, text):
        pairs = _caller_pairs(model, fn, text)
        if pairs and len(pairs) == len(model.callers_of(fn)):
            return any(mode_sensitive_at(model, site, o, depth + 1) for site, o in pairs)
    outer = _caller_names(model, fn, text) if fn is not None else set()
    has_ctor = any(a.kind in ("assign", "annassign") and a.binds(text) for a in model.assigns)
    if outer and not has_ctor:
        return any(mode_sensitive(model, o) for o in outer)
    # The constructions that may reach this call in its own scope decide (a
    # notebook's later cell rebinding ``model`` does not change earlier cells);
    # without one there, every construction of the name in the file.
    here = _bindings_sensitive(model, text, model.reaching_bindings(text, call), functions=True)
    if here is None and fn is not None and "." not in text and not model.bindings_of(text, call.scope):
        anchors = _module_level_callers(model, fn)
        if anchors:
            # a global the function reads: what it holds where the script calls the function
            # (a notebook's later cell that rebinds ``model`` before calling ``accuracy()``)
            here = _bindings_sensitive(model, text, [b for a in anchors for b in model.reaching_bindings(text, a)],
                                       functions=True)
    return mode_sensitive(model, text) if here is None else here


def _module_level_callers(model: FileModel, fn: Scope, depth: int = 0) -> Optional[list[Call]]:
    """The module-level call sites from which the function ``fn`` runs:
    its same-file callers at module level, and those of the functions that
    call it (up to three calls deep); ``None`` when some caller chain does
    not end at module level (a function nobody in the file calls, a method)."""
    callers = model.callers_of(fn)
    if not callers or depth > 2:
        return None
    out: list[Call] = []
    for c in callers:
        outer = model.enclosing_function(c.scope)
        if outer is None:
            out.append(c)
            continue
        if outer.class_name is not None:
            return None
        found = _module_level_callers(model, outer, depth + 1)
        if found is None:
            return None
        out += found
    return out


def trains_sensitive_module_at(model: FileModel, call: Call, text: str) -> bool:
    """Whether module ``text`` may be in training mode at ``call`` *and* may
    depend on that mode, judged together for each same-file caller when
    ``text`` is a parameter the function does not switch itself: a
    freshly built mode-free module from one caller and a module of unknown
    origin and unknown mode from another are no evidence of a
    mode-sensitive module in training mode."""
    if not may_be_training(model, call, text) or not mode_sensitive_at(model, call, text):
        return False
    fn = model.enclosing_function(call.scope)
    if fn is None or text.split(".")[0] not in fn.params \
            or any(e.order < call.order for e in events(model, call.scope, text)):
        return True
    pairs = _caller_pairs(model, fn, text)
    if not pairs:
        return True
    return any(modes_at(model, site, o) & TRAINING_KINDS and mode_sensitive_at(model, site, o) for site, o in pairs)


def _output_unbound(call: Call) -> bool:
    """Whether the module call ``call``'s output is bound to no name: an
    expression statement, or ``_ = model(x)``."""
    stmt = call.statement
    return isinstance(stmt, cst.Expr) and stmt.value is call.node or assigned_names(stmt, call.node) == ["_"]


def output_discarded(model: FileModel, call: Call) -> bool:
    """Whether nothing reads what the module call ``call`` returns: it is
    bound to no name (:func:`_output_unbound`), or to names (``out =
    model(x)``, ``a, b = net(x)``) that are never read (:func:`.reads.never_read`),
    or whose values this binding gives are never read: every read is reached only by
    later bindings (:func:`.reads.binding_never_read`)."""
    if _output_unbound(call):
        return True
    names = assigned_names(call.statement, call.node)
    return bool(names) and (never_read(model, names, call.scope) or all(
        binding_never_read(model, call.statement, n, call.scope) for n in names))


def initialises_fresh_module(model: FileModel, call: Call, text: str) -> bool:
    """Whether the module call ``call`` of ``text`` is a dummy forward of a
    module built and never trained yet whose output is never read
    (``with torch.no_grad(): out = model(x)`` to initialise lazy modules, as
    PyTorch Geometric's examples do before building the optimizer): it
    evaluates nothing, and nothing trained can be spoiled yet. A module that
    holds weights already (a model-zoo model, a loaded state dict or
    checkpoint: :func:`_has_weights`) has nothing lazy to initialise: a
    forward of it in training mode is a (warm-up) evaluation whose batch
    norm still rewrites the pretrained running statistics. A forward whose
    output is read only for its shape (``print(out.shape)`` after building a
    UNet: :func:`.reads.read_only_for_shape`) is such a probe too."""
    return not modes_at(model, call, text) - {BUILT} and not _has_weights(model, call, text) \
        and (output_discarded(model, call) or _read_only_for_shape(model, call))


def _read_only_for_shape(model: FileModel, call: Call) -> bool:
    names = assigned_names(call.statement, call.node)
    return bool(names) and all(read_only_for_shape(model, call.statement, n, call.scope) for n in names)


def recalibrates_statistics(model: FileModel, call: Call, text: str) -> bool:
    """Whether a module call under no_grad looks like a deliberate batch-norm
    statistics pass (``torch.optim.swa_utils.update_bn`` written by hand):
    its output is not even bound to a name (an expression statement, ``_ =
    model(x)``); or the module was switched to training mode for it by an
    explicit ``.train()`` never followed by training (:func:`_untrained_switch`)
    and nothing reads the output (BigGAN's standing statistics: ``net.train()``,
    then ``x = net(z, y)`` under no_grad in a loop); or its function resets
    running statistics."""
    if _output_unbound(call):
        return True
    if _untrained_switch(model, call, text) is not None and output_discarded(model, call):
        return True
    fn = model.enclosing_function(call.scope) or model.module_scope
    return any(c.method == "reset_running_stats" or c.method == "update_bn"
               for c in model.calls_within(fn.order, fn.end))
