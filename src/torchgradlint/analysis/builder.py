"""The single LibCST traversal that fills a :class:`FileModel`.

One pass records imports, scopes, loops, suites, grad-mode regions, calls and
bindings. No LibCST metadata provider runs here; positions are resolved later
and only for reported nodes.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from . import grad_mode
from .model import Assign, Call, ClassInfo, FileModel, GradMode, Loop, Region, Return, Scope, Target
from .names import dotted_name
from .tree import children, node_types

_AUG_OPS = {
    "AddAssign": "+=", "SubtractAssign": "-=", "MultiplyAssign": "*=", "DivideAssign": "/=",
    "FloorDivideAssign": "//=", "ModuloAssign": "%=", "PowerAssign": "**=",
    "MatrixMultiplyAssign": "@=", "BitOrAssign": "|=", "BitAndAssign": "&=",
    "BitXorAssign": "^=", "LeftShiftAssign": "<<=", "RightShiftAssign": ">>=",
}

_SUITES = node_types(cst.IndentedBlock, cst.SimpleStatementSuite)
_STATEMENTS = node_types(cst.BaseSmallStatement, cst.BaseCompoundStatement)


def _flatten_targets(node: cst.BaseExpression, out: list[Target]) -> bool:
    """Append the places ``node`` assigns; return True if it unpacks."""
    if isinstance(node, cst.Name):
        out.append(Target(node.value, "name", node=node))
    elif isinstance(node, cst.Attribute):
        out.append(Target(dotted_name(node), "attr", node=node))
    elif isinstance(node, cst.Subscript):
        out.append(Target(None, "subscript", container=dotted_name(node.value), node=node))
    elif isinstance(node, (cst.Tuple, cst.List)):
        for el in node.elements:
            _flatten_targets(el.value, out)
        return True
    elif isinstance(node, cst.StarredElement):
        _flatten_targets(node.value, out)
        return True
    return False


def _parallel_pairs(node: cst.Assign) -> Optional[list[tuple[cst.BaseExpression, cst.BaseExpression]]]:
    """``(target, value)`` pairs of a parallel assignment ``a, b = x, y``
    (one target list, a tuple of the same length, no starred element, no
    nested unpacking); ``None`` for any other assignment."""
    if len(node.targets) != 1:
        return None
    target, value = node.targets[0].target, node.value
    if not isinstance(target, (cst.Tuple, cst.List)) or not isinstance(value, (cst.Tuple, cst.List)) \
            or len(target.elements) != len(value.elements):
        return None
    pairs = []
    for t, v in zip(target.elements, value.elements):
        if isinstance(t, cst.StarredElement) or isinstance(v, cst.StarredElement) \
                or not isinstance(t.value, (cst.Name, cst.Attribute)):
            return None
        pairs.append((t.value, v.value))
    return pairs


_NESTED = (cst.For, cst.While, cst.FunctionDef, cst.ClassDef, cst.Lambda)


def _runs_once(node: cst.CSTNode) -> bool:
    """Whether the loop ``node`` never starts a second iteration: a statement
    of its body (not nested in a branch) is ``break``, ``return`` or
    ``raise``, and no ``continue`` of this loop can skip it."""
    body = getattr(node.body, "body", ())
    exits = False
    for stmt in body:
        if isinstance(stmt, cst.SimpleStatementLine) and any(
                isinstance(small, (cst.Break, cst.Return, cst.Raise)) for small in stmt.body):
            exits = True
            break
    if not exits:
        return False
    stack = list(body)
    while stack:
        item = stack.pop()
        if isinstance(item, cst.Continue):
            return False
        if not isinstance(item, _NESTED):
            stack.extend(children(item))
    return True


class _ScopeState:
    __slots__ = ("scope", "loops", "blocks", "regions", "statements")

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.loops: list[Loop] = []
        self.blocks: list[cst.CSTNode] = []
        self.regions: list[tuple[Region, cst.CSTNode]] = []  # (region, suite that ends it)
        self.statements: list[cst.CSTNode] = []


class _Builder:
    def __init__(self, model: FileModel) -> None:
        self.m = model
        self.n = 0
        self.states: list[_ScopeState] = []
        self.pending_scope: dict[int, Scope] = {}
        self.pending_region: dict[int, Region] = {}
        self.open_regions: dict[int, Region] = {}  # id(With) -> region, to set .end
        self.one_shot: set[int] = set()  # ids of loops that never start a second iteration (:func:`_runs_once`)
        self.classes: list[Optional[ClassInfo]] = []

    # -- helpers ---------------------------------------------------------------
    @property
    def st(self) -> _ScopeState:
        return self.states[-1]

    def _loc(self) -> dict:
        st = self.st
        return dict(
            scope=st.scope,
            order=self.n,
            loops=tuple(st.loops),
            blocks=tuple(st.blocks),
            region=st.regions[-1][0] if st.regions else None,
            statement=st.statements[-1] if st.statements else st.scope.node,
        )

    def _push_scope(self, scope: Scope) -> None:
        self.m.scopes.append(scope)
        self.states.append(_ScopeState(scope))

    # -- traversal -------------------------------------------------------------
    def walk(self, node: cst.CSTNode) -> None:
        """Visit ``node`` and its subtree in source order (see :mod:`.tree`).

        Iterative (an explicit stack), so a deeply nested file (1,000 nested
        list displays, a 10,000-long subscript chain) costs no Python
        recursion; ``on_leave`` runs after a node's last child, for the
        kinds it handles (:data:`_LEAVE_KINDS`; a 1-tuple on the stack marks
        it). A node of a kind that neither handler looks at (most of them:
        names, attributes, operators, literals) only takes its number.
        """
        visited = _VISIT_KINDS
        left = _LEAVE_KINDS
        stack: list = [node]
        pop, push, extend = stack.pop, stack.append, stack.extend
        while stack:
            item = pop()
            kind = type(item)
            if kind is tuple:
                self.on_leave(item[0])
                continue
            if kind in visited:
                self.on_visit(item)
            else:
                self.n += 1
            if kind in left:
                push((item,))
            kids = children(item)
            if kids:
                kids.reverse()
                extend(kids)

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.n += 1
        kind = type(node)
        if kind in _SUITES:
            self._enter_suite(node)
        elif kind in _STATEMENTS:
            self.st.statements.append(node)
        handler = _VISIT.get(kind.__name__)
        if handler is not None:
            handler(self, node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        node = original_node
        kind = type(node)
        name = kind.__name__
        if kind in _SUITES:
            self._leave_suite(node)
        elif kind in _STATEMENTS:
            if name == "Expr":
                self._statement_grad_switch(node)
            st = self.st
            if st.statements and st.statements[-1] is node:
                st.statements.pop()
        if name in ("For", "While"):
            if id(node) in self.one_shot:
                return
            loop = self.st.loops.pop()
            loop.end = self.n
        elif name in ("FunctionDef", "ClassDef"):
            for scope in reversed(self.m.scopes):
                if scope.node is node:
                    scope.end = self.n
                    break
            if name == "ClassDef":
                self.classes.pop()
        elif name == "Lambda":
            state = self.states.pop()
            state.scope.end = self.n
        elif name == "With":
            region = self.open_regions.pop(id(node), None)
            if region is not None:
                region.end = self.n
        elif name == "Module":
            self.st.scope.end = self.n

    def _enter_suite(self, node: cst.CSTNode) -> None:
        scope = self.pending_scope.pop(id(node), None)
        if scope is not None:
            self._push_scope(scope)
            if scope.kind == "function":
                self._record_params(scope)
        st = self.st
        st.blocks.append(node)
        region = self.pending_region.pop(id(node), None)
        if region is not None:
            st.regions.append((region, node))

    def _leave_suite(self, node: cst.CSTNode) -> None:
        st = self.st
        while st.regions and st.regions[-1][1] is node:
            region = st.regions.pop()[0]
            if region.kind == "statement":
                region.end = self.n
        if st.blocks and st.blocks[-1] is node:
            st.blocks.pop()
        if st.scope.kind in ("function", "class") and not st.blocks:
            self.states.pop()

    def _record_params(self, scope: Scope) -> None:
        fn = scope.node
        assert isinstance(fn, cst.FunctionDef)
        p = fn.params
        params = [*p.posonly_params, *p.params, *p.kwonly_params]
        for extra in (p.star_arg, p.star_kwarg):
            if isinstance(extra, cst.Param):
                params.append(extra)
        for param in params:
            scope.params.append(param.name.value)
            self.m.assigns.append(
                Assign(**self._loc(), node=param, targets=[Target(param.name.value, "name", node=param.name)],
                       kind="param")
            )

    # -- node handlers ---------------------------------------------------------
    def v_Module(self, node: cst.Module) -> None:
        scope = Scope("module", node, "<module>", None, self.n)
        self._push_scope(scope)
        self.st.blocks.append(node)

    def v_Import(self, node: cst.CSTNode) -> None:
        self.m.names.add(node)

    def v_FunctionDef(self, node: cst.FunctionDef) -> None:
        parent = self.st.scope
        cls = self.classes[-1] if parent.kind == "class" and self.classes else None
        scope = Scope("function", node, node.name.value, parent, self.n,
                      class_name=cls.name if cls else None)
        for dec in node.decorators:
            expr = dec.decorator
            call = expr if isinstance(expr, cst.Call) else None
            qn = self.m.qualname(call.func if call else expr)
            mode = grad_mode.classify(qn, call)
            if mode is None:
                mode = grad_mode.other_decorator(qn or dotted_name(call.func if call else expr) or "",
                                                 bool(self.m.functions.get(qn or "")), self.m.project)
            if mode is not None:
                scope.decorator_region = Region(node, mode, "decorator", qn or "", self.n, decorator=dec)
        if cls is not None:
            cls.methods[node.name.value] = scope
        self.m.functions.setdefault(node.name.value, []).append(scope)
        self.pending_scope[id(node.body)] = scope

    def v_ClassDef(self, node: cst.ClassDef) -> None:
        texts = [dotted_name(b.value) or "" for b in node.bases if b.keyword is None]
        info = ClassInfo(node, node.name.value, [self.m.names.qualify(t) or "" for t in texts], texts, order=self.n)
        self.m.classes[node.name.value] = info
        self.m.class_versions.setdefault(node.name.value, []).append(info)
        self.classes.append(info)
        scope = Scope("class", node, node.name.value, self.st.scope, self.n)
        self.pending_scope[id(node.body)] = scope

    def v_Lambda(self, node: cst.Lambda) -> None:
        scope = Scope("lambda", node, "<lambda>", self.st.scope, self.n)
        self._push_scope(scope)
        for param in node.params.params:
            scope.params.append(param.name.value)

    def v_Loop(self, node: cst.CSTNode) -> None:
        st = self.st
        if _runs_once(node):
            # ``for x, y in loader: ...; break``: one iteration at most, so no
            # iteration's state reaches another; its body is straight-line code
            self.one_shot.add(id(node))
        else:
            loop = Loop(node, st.scope, st.loops[-1] if st.loops else None, self.n)
            self.m.loops.append(loop)
            st.loops.append(loop)
        if isinstance(node, cst.For):
            targets: list[Target] = []
            unpacked = _flatten_targets(node.target, targets)
            self.m.assigns.append(Assign(**self._loc(), node=node, targets=targets, value=node.iter,
                                         kind="for", unpacked=unpacked))

    def v_With(self, node: cst.With) -> None:
        region: Optional[Region] = None
        self.m.with_bodies.add(id(node.body))
        for item in node.items:
            expr = item.item
            call = expr if isinstance(expr, cst.Call) else None
            qn = self.m.qualname(call.func if call else expr)
            mode = grad_mode.classify(qn, call)
            if mode is not None:
                region = Region(node, mode, "with", qn or "", self.n,
                                flag=call.args[0].value if mode is GradMode.UNKNOWN and call and call.args else None)
            if item.asname is not None:
                targets: list[Target] = []
                unpacked = _flatten_targets(item.asname.name, targets)
                self.m.assigns.append(Assign(**self._loc(), node=item, targets=targets, value=expr,
                                             kind="with", unpacked=unpacked))
        if region is not None:
            self.m.regions.append(region)
            self.open_regions[id(node)] = region
            self.pending_region[id(node.body)] = region

    def _statement_grad_switch(self, node: cst.Expr) -> None:
        """``torch.set_grad_enabled(False)`` as a statement switches grad mode
        for the rest of the enclosing suite."""
        call = node.value
        if not isinstance(call, cst.Call):
            return
        qn = self.m.qualname(call.func)
        if qn != "torch.set_grad_enabled":
            return
        mode = grad_mode.classify(qn, call)
        st = self.st
        if mode is None or not st.blocks:
            return
        region = Region(node, mode, "statement", qn, self.n)
        self.m.regions.append(region)
        st.regions.append((region, st.blocks[-1]))

    def v_Call(self, node: cst.Call) -> None:
        func = node.func
        text = dotted_name(func)
        receiver = func.value if isinstance(func, cst.Attribute) else None
        method = func.attr.value if isinstance(func, cst.Attribute) else (
            func.value if isinstance(func, cst.Name) else None)
        self.m.calls.append(Call(
            **self._loc(), node=node, func_text=text, qualname=self.m.names.qualify(text),
            receiver=receiver, receiver_text=dotted_name(receiver) if receiver is not None else None,
            method=method,
        ))

    def v_Assign(self, node: cst.Assign) -> None:
        pairs = _parallel_pairs(node)
        if pairs is not None:  # ``net, preds = get_net(), []``: one binding per element
            for target, value in pairs:
                targets = []
                _flatten_targets(target, targets)
                self.m.assigns.append(Assign(**self._loc(), node=node, targets=targets, value=value, kind="assign"))
            return
        targets: list[Target] = []
        unpacked = False
        for t in node.targets:
            unpacked |= _flatten_targets(t.target, targets)
        self.m.assigns.append(Assign(**self._loc(), node=node, targets=targets, value=node.value,
                                     kind="assign", unpacked=unpacked))

    def v_AugAssign(self, node: cst.AugAssign) -> None:
        targets: list[Target] = []
        _flatten_targets(node.target, targets)
        op = _AUG_OPS.get(type(node.operator).__name__, "?=")
        self.m.assigns.append(Assign(**self._loc(), node=node, targets=targets, value=node.value,
                                     kind="augassign", op=op))

    def v_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is None:
            return
        targets: list[Target] = []
        _flatten_targets(node.target, targets)
        self.m.assigns.append(Assign(**self._loc(), node=node, targets=targets, value=node.value,
                                     kind="annassign"))

    def v_Return(self, node: cst.Return) -> None:
        self.m.returns.append(Return(**self._loc(), node=node, value=node.value))

    def v_NamedExpr(self, node: cst.NamedExpr) -> None:
        targets: list[Target] = []
        _flatten_targets(node.target, targets)
        self.m.assigns.append(Assign(**self._loc(), node=node, targets=targets, value=node.value,
                                     kind="walrus"))


_VISIT = {
    "Module": _Builder.v_Module,
    "Import": _Builder.v_Import,
    "ImportFrom": _Builder.v_Import,
    "FunctionDef": _Builder.v_FunctionDef,
    "ClassDef": _Builder.v_ClassDef,
    "Lambda": _Builder.v_Lambda,
    "For": _Builder.v_Loop,
    "While": _Builder.v_Loop,
    "With": _Builder.v_With,
    "Call": _Builder.v_Call,
    "Assign": _Builder.v_Assign,
    "AugAssign": _Builder.v_AugAssign,
    "AnnAssign": _Builder.v_AnnAssign,
    "NamedExpr": _Builder.v_NamedExpr,
    "Return": _Builder.v_Return,
}


# The kinds ``on_visit`` / ``on_leave`` do something for; every other node only takes its number.
_VISIT_KINDS = _SUITES | _STATEMENTS | frozenset(getattr(cst, name) for name in _VISIT)
_LEAVE_KINDS = _SUITES | _STATEMENTS | frozenset({cst.For, cst.While, cst.FunctionDef, cst.ClassDef, cst.Lambda,
                                                  cst.With, cst.Module})


def build_model(module: cst.Module, source: str, path: str, project: Optional[object] = None) -> FileModel:
    """Run the one traversal over ``module`` and return its facts.

    Args:
        module: the parsed file (``libcst.parse_module``).
        source: the file's text, for rules that need raw text.
        path: the path shown in diagnostics.
        project: the file's view of its project index
            (:class:`torchgradlint.project_index.ProjectView`), or ``None``.
    """
    model = FileModel(module, source, path)
    model.project = project
    _Builder(model).walk(module)
    _assume_conventional_names(model)
    return model


def _assume_conventional_names(model: FileModel) -> None:
    """Resolve ``nn``/``F``/``optim``... that the file never binds to torch's
    modules (:data:`.names.CONVENTIONAL`) and requalify what was qualified
    during the traversal."""
    bound = set(model.names.aliases) | set(model.functions) | set(model.classes)
    for a in model.assigns:
        for t in a.targets:
            if t.text:
                bound.add(t.text.split(".")[0])
    # ``nn = torch.nn`` at module level: an alias made by assignment.
    assigned = False
    for a in model.assigns_in_scope(model.module_scope):
        if a.kind == "assign" and len(a.targets) == 1 and a.targets[0].kind == "name" and not a.unpacked:
            value = dotted_name(a.value)
            qualified = model.names.qualify(value) if value else None
            if qualified and qualified.split(".")[0] == "torch" and value != a.targets[0].text:
                model.names.aliases[a.targets[0].text] = qualified
                assigned = True
    if not model.names.assume_conventional(bound) and not assigned:
        return
    qualify = model.names.qualify
    for call in model.calls:
        if call.func_text:
            call.qualname = qualify(call.func_text)
    for info in model.classes.values():
        info.bases = [qualify(t) or "" for t in info.base_texts]
