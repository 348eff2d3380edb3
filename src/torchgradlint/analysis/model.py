"""Fact records of one file and the queries rules make over them.

Every fact carries ``order``: its node's pre-order index in the traversal, so
``a.order < b.order`` means ``a`` starts before ``b`` in the source, and a
node ``n`` lies inside a compound node ``c`` iff ``c.order <= n.order <=
c.end``. Positions (line/column) are not computed here: the engine resolves
them only for the nodes that end up reported.
"""

from __future__ import annotations

import bisect
import enum
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

import libcst as cst

from .literals import falsy_literal, literal_bool
from .names import ImportTable, dotted_name
from .torch_api import RECEIVER_METHODS
from .tree import walk


class GradMode(enum.Enum):
    """Autograd's grad mode where a node runs.

    ``INHERITED`` appears only as a *local* mode: no region inside the scope
    says anything, so the scope's base mode applies (see
    :meth:`FileModel.grad_mode`).
    """

    ENABLED = "enabled"
    DISABLED = "disabled"
    UNKNOWN = "unknown"
    INHERITED = "inherited"


@dataclass(eq=False)
class Region:
    """A grad-mode region: a ``with`` body, a decorated function body, or the
    rest of a block after a bare ``torch.set_grad_enabled(flag)`` statement.

    ``kind`` is ``"with"``, ``"decorator"`` or ``"statement"``; ``api`` the
    qualified name that opened it (``torch.no_grad``...).
    """

    node: cst.CSTNode
    mode: GradMode
    kind: str
    api: str
    order: int
    end: int = -1
    flag: Optional[cst.BaseExpression] = None
    """The non-literal flag of ``set_grad_enabled(flag)`` (mode ``UNKNOWN``)."""
    decorator: Optional[cst.Decorator] = None
    """For a ``"decorator"`` region, the decorator that opened it (``node`` is the function)."""


@dataclass(eq=False)
class Loop:
    """A ``for`` or ``while`` loop (comprehensions are not loops here)."""

    node: cst.CSTNode
    scope: "Scope"
    parent: Optional["Loop"]
    order: int
    end: int = -1

    def contains(self, order: int) -> bool:
        """Whether the node with pre-order index ``order`` lies in the loop."""
        return self.order <= order <= self.end


@dataclass(eq=False)
class Scope:
    """The module, a function, a lambda or a class body.

    Module-level script code is a scope like a function body. ``base_mode``
    is the grad mode a function's decorator imposes (``INHERITED`` if none).
    """

    kind: str  # "module" | "function" | "lambda" | "class"
    node: cst.CSTNode
    name: str
    parent: Optional["Scope"]
    order: int
    end: int = -1
    params: list[str] = field(default_factory=list)
    class_name: Optional[str] = None
    decorator_region: Optional[Region] = None

    @property
    def qualname(self) -> str:
        """``Class.method`` for methods, the bare name otherwise."""
        return f"{self.class_name}.{self.name}" if self.class_name else self.name

    def contains(self, order: int) -> bool:
        """Whether the node with pre-order index ``order`` lies in the scope."""
        return self.order <= order <= self.end


@dataclass(eq=False)
class _Located:
    scope: Scope
    order: int
    loops: tuple[Loop, ...]  # outermost first, within ``scope`` only
    blocks: tuple[cst.CSTNode, ...]  # enclosing suites within ``scope``, outermost first
    region: Optional[Region]  # innermost grad-mode region within ``scope``
    statement: cst.CSTNode  # innermost enclosing statement

    @property
    def loop(self) -> Optional[Loop]:
        """The innermost enclosing loop in the same scope."""
        return self.loops[-1] if self.loops else None

    def dominates(self, other: "_Located") -> bool:
        """Straight-line test: ``self`` runs before ``other`` whenever ``other``
        runs (same scope, earlier, in the same or an enclosing suite)."""
        if self.scope is not other.scope or self.order >= other.order:
            return False
        n = len(self.blocks)
        return other.blocks[:n] == self.blocks


@dataclass(eq=False)
class Call(_Located):
    """A call expression.

    ``func_text`` is the callee's dotted text (``opt.step``, ``model``),
    ``qualname`` that text resolved through imports (``torch.no_grad``);
    ``receiver`` the object of a method call and ``method`` its name.
    """

    node: cst.Call = None  # type: ignore[assignment]
    func_text: Optional[str] = None
    qualname: Optional[str] = None
    receiver: Optional[cst.BaseExpression] = None
    receiver_text: Optional[str] = None
    method: Optional[str] = None

    def arg(self, position: int, keyword: Optional[str] = None) -> Optional[cst.BaseExpression]:
        """The argument at ``position`` (positional) or named ``keyword``."""
        positional = [a for a in self.node.args if a.keyword is None and not a.star]
        if keyword is not None:
            for a in self.node.args:
                if a.keyword is not None and a.keyword.value == keyword:
                    return a.value
        if 0 <= position < len(positional):
            return positional[position].value
        return None

    def keyword(self, name: str) -> Optional[cst.BaseExpression]:
        """The value of keyword argument ``name``, if given."""
        for a in self.node.args:
            if a.keyword is not None and a.keyword.value == name:
                return a.value
        return None


@dataclass(eq=False)
class Target:
    """One assigned place: ``name`` (``x``), ``attr`` (``self.x``) or
    ``subscript`` (``d[k]``, with ``container`` the dotted text of ``d``)."""

    text: Optional[str]
    kind: str
    container: Optional[str] = None
    node: Optional[cst.CSTNode] = None


@dataclass(eq=False)
class Assign(_Located):
    """An assignment-like binding.

    ``kind``: ``assign``, ``augassign`` (``op`` is e.g. ``+=``), ``annassign``,
    ``for`` (loop target; ``value`` is the iterable), ``with`` (``as``
    target), ``walrus`` or ``param`` (``value`` is ``None``).
    ``unpacked`` is true when the target was one element of a tuple/list.
    """

    node: cst.CSTNode = None  # type: ignore[assignment]
    targets: list[Target] = field(default_factory=list)
    value: Optional[cst.BaseExpression] = None
    kind: str = "assign"
    op: Optional[str] = None
    unpacked: bool = False

    def binds(self, text: str) -> bool:
        """Whether this binding (re)binds the name or attribute ``text``."""
        return any(t.text == text and t.kind in ("name", "attr") for t in self.targets)


@dataclass(eq=False)
class Return(_Located):
    """A ``return value`` statement of a function (``value`` may be ``None``)."""

    node: cst.Return = None  # type: ignore[assignment]
    value: Optional[cst.BaseExpression] = None


@dataclass(eq=False)
class ClassInfo:
    """A class definition: its name, qualified base names and method scopes."""

    node: cst.ClassDef
    name: str
    bases: list[str]
    base_texts: list[str] = field(default_factory=list)
    methods: dict[str, Scope] = field(default_factory=dict)
    order: int = -1  # pre-order index of the ``class`` statement


# Methods that return their receiver: mode, device and dtype calls (``Agent(...).to(device)``
# is the agent, ``Net().to(device).train()`` the net).
def unwrap(node: Optional[cst.BaseExpression],
           methods: frozenset[str] = RECEIVER_METHODS) -> Optional[cst.BaseExpression]:
    """``Net().to(device).train()`` -> ``Net()``: strip mode/device/dtype calls
    (``methods``: :data:`~.torch_api.RECEIVER_METHODS`, or
    :data:`~.torch_api.MODULE_RETURNING_METHODS` where the object is a module)."""
    while (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
           and node.func.attr.value in methods):
        node = node.func.value
    return node


def called_at_once(call: "Call") -> bool:
    """Whether what ``call`` returns is called right away, in the same
    expression (``nn.Sequential(*self.layers)(x)``, ``nn.Dropout(0.25)(h)``):
    a new object per evaluation, never stored."""
    return any(isinstance(n, cst.Call) and n.func is call.node for n in walk(call.statement))


class FileModel:
    """All facts of one file, in source order, with the queries rules use.

    Built by :func:`torchgradlint.analysis.builder.build_model`; rules treat it
    as read-only.
    """

    def __init__(self, module: cst.Module, source: str, path: str) -> None:
        self.module = module
        self.source = source
        self.path = path
        self.names = ImportTable()
        self.scopes: list[Scope] = []
        self.loops: list[Loop] = []
        self.calls: list[Call] = []
        self.assigns: list[Assign] = []
        self.regions: list[Region] = []
        self.returns: list[Return] = []
        self.classes: dict[str, ClassInfo] = {}  # the last definition of each name
        self.class_versions: dict[str, list[ClassInfo]] = {}  # every definition, in source order
        self.functions: dict[str, list[Scope]] = {}
        # ids of ``with`` statement bodies: they always run, so they do not break dominance
        self.with_bodies: set[int] = set()
        self._base_mode_cache: dict[int, GradMode] = {}
        self._callers_cache: dict[int, list[Call]] = {}
        self._call_orders: Optional[list[int]] = None
        self._assign_orders: Optional[list[int]] = None
        self._bindings: Optional[dict[tuple[str, int], list[Assign]]] = None
        self._by_scope: dict[int, tuple[list[Call], list[Assign]]] = {}
        self.memo: dict[object, object] = {}  # per-file cache for analysis queries
        # facts of the file's project (``torchgradlint.project_index.ProjectView``), ``None`` when the
        # file is linted alone (standard input, the language server, flake8 outside a project)
        self.project: Optional[Any] = None

    def cached(self, key: object, factory):
        """Per-file cache for analysis modules: ``factory()`` once per ``key``."""
        value = self.memo.get(key)
        if value is None:
            value = self.memo[key] = factory()
        return value

    def call_for(self, node: cst.CSTNode) -> Optional["Call"]:
        """The :class:`Call` fact recorded for the call node ``node`` (``None``
        if ``node`` is no recorded call)."""
        return self.cached("calls_by_node", lambda: {id(c.node): c for c in self.calls}).get(id(node))

    def memoised(self, table: object, key: object, compute):
        """``compute()`` once per ``key`` of the per-file table ``table``
        (a query's memo: ``table`` is usually the query's function)."""
        memo = self.cached(table, dict)
        if key not in memo:
            memo[key] = compute()
        return memo[key]

    def _index(self) -> None:
        """Order indexes for range queries (facts are appended in pre-order)."""
        self._call_orders = [c.order for c in self.calls]
        self._assign_orders = [a.order for a in self.assigns]
        self._bindings = {}
        for a in self.assigns:
            for t in a.targets:
                if t.text and t.kind in ("name", "attr"):
                    self._bindings.setdefault((t.text, id(a.scope)), []).append(a)
        for c in self.calls:
            self._by_scope.setdefault(id(c.scope), ([], []))[0].append(c)
        for a in self.assigns:
            self._by_scope.setdefault(id(a.scope), ([], []))[1].append(a)

    # -- names ---------------------------------------------------------------
    def qualname(self, node: Optional[cst.CSTNode]) -> Optional[str]:
        """Qualified name of a dotted expression (``T.no_grad`` → ``torch.no_grad``)."""
        return self.names.qualify(dotted_name(node))

    @property
    def module_scope(self) -> Scope:
        """The file's top-level scope."""
        return self.scopes[0]

    # -- containment ---------------------------------------------------------
    def calls_in_scope(self, scope: Scope) -> list[Call]:
        """Calls whose own scope is ``scope`` (nested defs excluded)."""
        if self._call_orders is None:
            self._index()
        return list(self._by_scope.get(id(scope), ([], []))[0])

    def calls_within(self, order: int, end: int) -> list[Call]:
        """Calls lexically inside the node span ``[order, end]``, nested defs
        and lambdas included."""
        if self._call_orders is None:
            self._index()
        lo = bisect.bisect_left(self._call_orders, order)
        hi = bisect.bisect_right(self._call_orders, end)
        return self.calls[lo:hi]

    def assigns_in_scope(self, scope: Scope) -> list[Assign]:
        """Bindings whose own scope is ``scope``."""
        if self._call_orders is None:
            self._index()
        return list(self._by_scope.get(id(scope), ([], []))[1])

    def assigns_within(self, order: int, end: int) -> list[Assign]:
        """Bindings lexically inside ``[order, end]``."""
        if self._assign_orders is None:
            self._index()
        lo = bisect.bisect_left(self._assign_orders, order)
        hi = bisect.bisect_right(self._assign_orders, end)
        return self.assigns[lo:hi]

    def bindings_of(self, text: str, scope: Scope) -> list[Assign]:
        """Every binding of ``text`` (a name or dotted attribute) in ``scope``,
        in source order."""
        if self._bindings is None:
            self._index()
        return list(self._bindings.get((text, id(scope)), ()))

    def class_at(self, name: str, order: int) -> Optional[ClassInfo]:
        """The definition of class ``name`` that a statement at pre-order index
        ``order`` sees: the last one before it (a notebook that redefines a
        class in a later cell builds the earlier one before that cell), else
        the first."""
        versions = self.class_versions.get(name)
        if not versions or len(versions) == 1:
            return self.classes.get(name)
        before = [c for c in versions if c.order < order]
        return before[-1] if before else versions[0]

    def reaching_binding(self, text: str, at: _Located) -> Optional[Assign]:
        """The binding of ``text`` that certainly reaches ``at``, or ``None``.

        The latest binding before ``at`` in the same scope is returned only
        when it dominates ``at``: it sits in the same suite as ``at`` or an
        enclosing one, where ``with`` bodies count as part of their enclosing
        suite (a ``with`` body always runs, so ``with torch.no_grad(): out =
        model(x)`` reaches a use after the block). A binding in a branch or a
        loop body that ``at`` is outside of is ambiguous: ``None`` is returned
        and rules stay silent.
        """
        before = [a for a in self.bindings_of(text, at.scope) if a.order < at.order and a.statement is not at.statement]
        if not before:
            return None
        last = before[-1]
        return last if self.certainly_reaches(last, at) else None

    def certainly_reaches(self, binding: _Located, at: _Located) -> bool:
        """Whether ``binding`` runs whenever ``at`` runs, before it: same
        statement, or a suite of ``binding`` that encloses ``at`` (``with``
        bodies always run, so they count as their enclosing suite)."""
        if binding.dominates(at):
            return True
        bodies = self.with_bodies
        mine = tuple(b for b in binding.blocks if id(b) not in bodies)
        theirs = tuple(b for b in at.blocks if id(b) not in bodies)
        return binding.scope is at.scope and theirs[:len(mine)] == mine

    def reaching_bindings(self, text: str, at: _Located) -> list[Assign]:
        """Every binding of ``text`` in ``at``'s scope that may give it its
        value where ``at`` runs (a *may* answer, where
        :meth:`reaching_binding` is a *must* one): the latest binding that
        certainly reaches ``at``, the bindings after it in branches, and,
        inside a loop, the bindings later in the loop body (the previous
        iteration). Empty when ``text`` is not bound in the scope before
        ``at`` (a parameter counts as a binding).
        """
        mine = self.bindings_of(text, at.scope)
        # A statement binds after it evaluates its expressions (``h = rnn(x, h)``
        # reads the previous ``h``), so its own binding does not reach reads in it.
        before = [a for a in mine if a.order < at.order and a.statement is not at.statement]
        out: list[Assign] = []
        must: Optional[_Located] = None
        for a in reversed(before):
            if a not in out:
                out.append(a)
            if self.certainly_reaches(a, at):
                must = a
                break
            every = self._every_branch_binds(a, text, before, at)
            if every:
                out += [b for b in every if b not in out]
                must = a  # ``if gpu: out = x.cpu() else: out = x.numpy()``: one of them reaches
                break
        out.sort(key=lambda b: b.order)
        for loop in at.loops:
            if must is not None and loop.contains(must.order):
                continue  # the next iteration rebinds it before ``at`` again
            # What the previous iteration left: the bindings from ``at`` to the
            # end of the body, back to the last one that always runs.
            tail = [a for a in mine if (a.order > at.order or a.statement is at.statement) and loop.contains(a.order)]
            for a in reversed(tail):
                if a not in out:
                    out.append(a)
                if self.always_runs_in(loop, a):
                    break
        return out

    def _every_branch_binds(self, a: Assign, text: str, before: list[Assign], at: _Located) -> list[Assign]:
        """When ``a`` sits directly in a branch of an ``if``/``elif``/``else``
        chain that has an ``else``, runs before ``at`` whenever ``at`` runs
        (``at`` follows the chain in its suite or one nested in it), and binds
        ``text`` directly in every branch: those bindings (one of them
        certainly reaches ``at``); else an empty list."""
        if len(a.blocks) < 2 or a.scope is not at.scope:
            return []
        parent, branch = a.blocks[-2], a.blocks[-1]
        chain = next((st for st in getattr(parent, "body", ()) if isinstance(st, cst.If)
                      and any(x is branch for x in if_branches(st))), None)
        if chain is None:
            return []
        rest = chain.orelse
        while isinstance(rest, cst.If):
            rest = rest.orelse
        if rest is None:
            return []  # no ``else``: the chain may bind nothing
        n = len(a.blocks) - 1
        branches = if_branches(chain)
        if len(at.blocks) < n or any(x is not y for x, y in zip(at.blocks[:n], a.blocks[:n])) \
                or any(x is br for br in branches for x in at.blocks):
            return []  # ``at`` is not after the chain in an enclosing suite
        found: list[Assign] = []
        for br in branches:
            hit = [b for b in before if b.blocks and b.blocks[-1] is br]
            if not hit:
                return []
            found += hit
        return found

    def exclusive(self, a: _Located, b: _Located) -> bool:
        """Whether ``a`` and ``b`` sit in different branches of one ``if``
        statement (``if amp: opt.zero_grad() ... else: loss.backward()``):
        no run executes both in one pass."""
        if a.scope is not b.scope:
            return False
        i = 0
        while i < min(len(a.blocks), len(b.blocks)) and a.blocks[i] is b.blocks[i]:
            i += 1
        if i == 0 or i >= len(a.blocks) or i >= len(b.blocks):
            return False
        parent, first, second = a.blocks[i - 1], a.blocks[i], b.blocks[i]
        for stmt in getattr(parent, "body", ()):
            if isinstance(stmt, cst.If):
                branches = if_branches(stmt)
                if any(first is x for x in branches) and any(second is x for x in branches):
                    return True
        return False

    def always_runs_in(self, loop: Loop, fact: _Located) -> bool:
        """Whether ``fact`` sits directly in ``loop``'s body (``with`` bodies
        count as the suite around them): it runs on every iteration."""
        body = getattr(loop.node, "body", None)
        blocks = [b for b in fact.blocks if id(b) not in self.with_bodies]
        return bool(blocks) and blocks[-1] is body

    def returns_of(self, scope: Scope) -> list["Return"]:
        """The ``return`` statements whose own scope is ``scope``."""
        if self._call_orders is None:
            self._index()
        return [r for r in self.returns if r.scope is scope]

    def enclosing_function(self, scope: Scope) -> Optional[Scope]:
        """The nearest function scope at or above ``scope``."""
        s: Optional[Scope] = scope
        while s is not None and s.kind not in ("function", "lambda"):
            s = s.parent
        return s

    # -- same-file functions ---------------------------------------------------
    def resolve_callee(self, call: Call) -> list[Scope]:
        """Same-file function scopes a call may invoke.

        ``f(...)`` resolves to top-level or sibling functions named ``f`` (a
        top-level call, to the top-level definition bound when it runs);
        ``self.f(...)``/``cls.f(...)`` to methods named ``f`` of the caller's
        class; ``obj(...)`` to ``__call__`` of the same-file class ``obj`` is an
        instance of (bound in the scope, or passed by every same-file caller); ``Class.f(...)`` to that class's method; ``obj.f(...)`` to the
        method of the same-file class ``obj`` is an instance of
        (:meth:`_instance_class`). Unknown receivers resolve to nothing.
        """
        text = call.func_text
        if not text:
            return []
        if "." not in text:
            found = [s for s in self.functions.get(text, []) if s.class_name is None]
            if len(found) > 1 and call.scope is self.module_scope \
                    and all(s.parent is self.module_scope for s in found):
                # script or notebook code that redefines ``f`` in a later cell: a top-level call
                # runs the definition bound when it runs, the last one before it
                before = [s for s in found if s.order < call.order]
                if before:
                    return [before[-1]]
            if not found and self.classes:
                # ``loss_compute(out, y, n)``: an instance of a same-file class with ``__call__``,
                # bound here or passed by every same-file caller (the annotated Transformer's
                # ``SimpleLossCompute`` handed to ``run_epoch``)
                binding = self.reaching_binding(text, call)
                if binding is not None and binding.kind == "param":
                    cls = self._parameter_class(text, call)
                elif text in self.cached("instance-names", self._instance_names):
                    cls = self.memoised(FileModel._instance_class, (text, call.order),
                                        lambda: self._instance_class(text, call))
                else:
                    cls = None
                method = self._method(cls, "__call__", set()) if cls is not None else None
                return [method] if method is not None else []
            return found
        head, _, rest = text.rpartition(".")
        if "." in rest:
            return []
        if head in ("self", "cls"):
            fn = self.enclosing_function(call.scope)
            cls = fn.class_name if fn is not None else None
            if cls is None:
                return []
            found = self._method(cls, rest, set())
            return [found] if found is not None else []
        if head in self.classes:
            m = self.classes[head].methods.get(rest)
            return [m] if m is not None else []
        cls = self.memoised(FileModel._instance_class, (head, call.order), lambda: self._instance_class(head, call)) \
            if head in self.cached("instance-names", self._instance_names) else None
        if cls is not None:
            found = self._method(cls, rest, set())
            return [found] if found is not None else []
        return []

    def _instance_names(self) -> frozenset[str]:
        """Names and attributes some assignment of the file binds to an
        instance of a same-file class (the only heads
        :meth:`_instance_class` can resolve)."""
        return frozenset(t.text for a in self.assigns if self._constructed_class(a.value) for t in a.targets if t.text)

    def _constructed_class(self, value: Optional[cst.BaseExpression]) -> Optional[str]:
        """``Agent`` for ``Agent(...)`` (through ``.to(device)``-style calls) of a same-file class."""
        value = unwrap(value)
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in self.classes:
            return value.func.value
        return None

    def _instance_class(self, head: str, call: Call) -> Optional[str]:
        """The same-file class whose instance ``head`` holds where ``call`` runs:
        ``agent = Agent(...)`` (through ``.to(device)``-style calls) binding a
        plain name that certainly reaches the call, or ``self.agent`` when
        every binding of it in the caller's class builds that class. ``None``
        when unknown (a parameter, a factory, several classes)."""
        if "." not in head:
            binding = self.reaching_binding(head, call)
            values = [binding.value] if binding is not None and binding.kind in ("assign", "annassign") \
                and not binding.unpacked else []
            if binding is None and self.global_in(head, call.scope):
                # a function reading a global (``actorcritic_net.forward_policy(s)`` in a method, the net
                # built in a later notebook cell): the module's bindings, whichever ran last
                bindings = self.bindings_of(head, self.module_scope)
                values = [a.value for a in bindings if a.kind in ("assign", "annassign") and not a.unpacked]
                if len(values) != len(bindings):
                    return None
        elif head.startswith("self.") and head.count(".") == 1:
            fn = self.enclosing_function(call.scope)
            info = self.classes.get(fn.class_name or "") if fn is not None else None
            bindings = [a for m in (info.methods.values() if info is not None else ()) for a in self.bindings_of(head, m)]
            values = [a.value for a in bindings if a.kind in ("assign", "annassign") and not a.unpacked]
            if len(values) != len(bindings):
                return None
        else:
            return None
        found = {self._constructed_class(value) for value in values}
        return found.pop() if len(found) == 1 else None  # ``{None}``: some value builds no same-file class

    def global_in(self, name: str, scope: Scope) -> bool:
        """Whether ``name`` read in ``scope`` (inside a function) is the module's
        global: no function or class scope around it binds the name."""
        s: Optional[Scope] = scope
        if s is self.module_scope:
            return False
        while s is not None and s is not self.module_scope:
            if s.kind != "class" and self.bindings_of(name, s):
                return False
            s = s.parent
        return True

    def parameter_methods(self, call: Call) -> list[Scope]:
        """For ``obj.f(...)`` where ``obj`` is a parameter of the function the
        call runs in: the method ``f`` of the same-file class every same-file
        caller passes an instance of (``train(..., ema_optimizer)`` called with
        ``WeightEMA(...)``), else ``[]``. Kept apart from
        :meth:`resolve_callee`: a question about one call (is this ``step`` an
        optimizer's?), not a binding of every value the method computes."""
        head, _, rest = (call.func_text or "").rpartition(".")
        if not head or "." in head or "." in rest:
            return []
        binding = self.reaching_binding(head, call)
        if binding is None or binding.kind != "param" or head not in self.cached("instance-names",
                                                                                  self._instance_names):
            return []
        cls = self._parameter_class(head, call)
        found = self._method(cls, rest, set()) if cls is not None else None
        return [found] if found is not None else []

    def _parameter_class(self, name: str, call: Call) -> Optional[str]:
        """For a parameter ``name`` of the function ``call`` runs in: the
        same-file class every same-file caller passes an instance of."""
        fn = self.enclosing_function(call.scope)
        visiting = self.memo.setdefault("instance-visiting", set())
        if fn is None or name not in fn.params or id(fn) in visiting:
            return None
        visiting.add(id(fn))
        try:
            found = set()
            for site in self.callers_of(fn):
                arg = argument_for(site, fn, name)
                text = dotted_name(arg) if arg is not None else None
                cls = self._instance_class(text, site) if text and text in self.cached(
                    "instance-names", self._instance_names) else None
                if cls is None:
                    return None
                found.add(cls)
            return found.pop() if len(found) == 1 else None
        finally:
            visiting.discard(id(fn))

    def _method(self, cls: str, name: str, seen: set[str]) -> Optional[Scope]:
        info = self.classes.get(cls)
        if info is None or cls in seen:
            return None
        seen.add(cls)
        if name in info.methods:
            return info.methods[name]
        for base in info.bases:
            found = self._method(base.split(".")[-1], name, seen)
            if found is not None:
                return found
        return None

    def callers_of(self, scope: Scope) -> list[Call]:
        """Same-file call sites that resolve to the function ``scope``."""
        key = id(scope)
        if key not in self._callers_cache:
            by_name = self.memo.get("calls_by_name")
            if by_name is None:
                by_name = {}
                for c in self.calls:
                    if c.func_text:
                        by_name.setdefault(c.func_text.rsplit(".", 1)[-1], []).append(c)
                self.memo["calls_by_name"] = by_name
            self._callers_cache[key] = [
                c for c in by_name.get(scope.name, ()) if scope in self.resolve_callee(c)
            ]
        return self._callers_cache[key]

    # -- grad mode -----------------------------------------------------------------
    def base_mode(self, scope: Scope, _depth: int = 0) -> GradMode:
        """Grad mode in force on entry to ``scope``.

        The module runs with grad enabled. A decorated function has its
        decorator's mode. An undecorated function does not inherit its
        definer's region; its mode is that of its same-file call sites when
        they all agree, else ``UNKNOWN`` (no call site, or mixed). A
        method that Python or ``nn.Module.__call__`` invokes implicitly
        (``forward``, dunders such as ``__call__``) has callers the file does
        not show (``module(x)``), so it is ``UNKNOWN`` too.
        """
        if scope.kind in ("module", "class"):
            return GradMode.ENABLED
        if scope.decorator_region is not None:
            return scope.decorator_region.mode
        key = id(scope)
        if key in self._base_mode_cache:
            return self._base_mode_cache[key]
        self._base_mode_cache[key] = GradMode.UNKNOWN  # recursion guard
        result = GradMode.UNKNOWN
        implicit = scope.class_name is not None and (
            scope.name == "forward" or (scope.name.startswith("__") and scope.name.endswith("__")))
        if _depth < 4 and scope.kind == "function" and not implicit:
            modes = {self.grad_mode(c, _depth + 1) for c in self.callers_of(scope)}
            if len(modes) == 1:
                result = modes.pop()
        if result is GradMode.UNKNOWN and scope.kind == "function" and scope in self.backward_scopes():
            result = GradMode.ENABLED
        self._base_mode_cache[key] = result
        return result

    def backward_scopes(self) -> set:
        """Function scopes that run a backward outside any grad-mode region
        of their own: whoever calls them must have grad enabled (the
        backward raises otherwise), so that is their base mode."""
        found = self.memo.get("backward_scopes")
        if found is None:
            from .steps import backward_call  # steps builds on this module

            found = set()
            for c in self.calls:
                if c.region is None and c.scope.kind == "function" and backward_call(self, c) is not None:
                    found.add(c.scope)
            self.memo["backward_scopes"] = found
        return found  # type: ignore[return-value]

    def grad_mode(self, fact: _Located, _depth: int = 0) -> GradMode:
        """Effective grad mode where ``fact`` runs."""
        region = fact.region
        if region is not None and region.mode is GradMode.UNKNOWN and region.flag is not None:
            return self._flag_mode(region, fact.scope, _depth)
        if region is not None and region.mode is not GradMode.INHERITED:
            return region.mode
        return self.base_mode(fact.scope, _depth)

    def _flag_mode(self, region: Region, scope: Scope, depth: int) -> GradMode:
        """``set_grad_enabled(flag)`` where ``flag`` is a parameter: the mode
        every same-file call site gives it (a literal argument, or the
        parameter's literal default when the call omits it); ``UNKNOWN``
        when they disagree, pass a non-literal or there is no call site."""
        fn = self.enclosing_function(scope)
        flag = region.flag
        if fn is None or not isinstance(flag, cst.Name) or flag.value not in fn.params or depth > 3:
            return GradMode.UNKNOWN
        index = fn.params.index(flag.value)
        default = param_default(fn, flag.value)
        values: set[Optional[bool]] = set()
        for site in self.callers_of(fn):
            offset = 1 if fn.class_name is not None and site.func_text and "." in site.func_text else 0
            arg = site.arg(index - offset, flag.value)
            value = arg if arg is not None else default
            values.add(literal_bool(value))
        if len(values) != 1 or None in values:
            return GradMode.UNKNOWN
        return GradMode.ENABLED if values.pop() else GradMode.DISABLED

    def regions_of(self, fact: _Located) -> list[Region]:
        """Grad-mode regions enclosing ``fact`` within its scope, outermost first."""
        return [r for r in self.regions if r.order <= fact.order <= r.end and fact.scope.contains(r.order)]


def param_default(fn: Scope, name: str) -> Optional[cst.BaseExpression]:
    """The default of the parameter ``name`` of the function ``fn``; ``None``
    when it has none or ``fn`` has no such parameter."""
    node = fn.node
    if not isinstance(node, cst.FunctionDef):
        return None
    p = node.params
    for param in [*p.posonly_params, *p.params, *p.kwonly_params]:
        if param.name.value == name:
            return param.default
    return None


def enclosing_ifs(fact: _Located) -> list[tuple[cst.If, cst.CSTNode]]:
    """The ``if`` statements around ``fact`` within its scope, outermost
    first, each with the suite of its chain (body, ``elif`` body or ``else``
    body) that holds ``fact``."""
    out = []
    for parent, inner in zip(fact.blocks, fact.blocks[1:]):
        for stmt in getattr(parent, "body", ()):
            if isinstance(stmt, cst.If) and any(b is inner for b in if_branches(stmt)):
                out.append((stmt, inner))
    return out


def if_branches(node: cst.If) -> list[cst.CSTNode]:
    """The suites of an ``if``/``elif``/``else`` chain."""
    out: list[cst.CSTNode] = [node.body]
    rest = node.orelse
    while rest is not None:
        if isinstance(rest, cst.If):
            out.append(rest.body)
            rest = rest.orelse
        else:
            out.append(rest.body)
            rest = None
    return out


def first(items: Iterable, default=None):
    """The first item of ``items`` or ``default``."""
    for item in items:
        return item
    return default


def names_in(node: Optional[cst.CSTNode]) -> set[str]:
    """Dotted names read anywhere in an expression (``a``, ``self.x``, ...).

    Both ``self.x`` and ``self`` are included for an attribute chain.
    """
    found: set[str] = set()
    if node is None:
        return found
    for n in walk(node):
        if isinstance(n, (cst.Name, cst.Attribute)):
            d = dotted_name(n)
            if d:
                found.add(d)
    return found




def call_params(call: "Call", callee: Scope) -> list[str]:
    """The parameters of ``callee`` that ``call``'s positional arguments
    fill, in order: without the bound ``self``/``cls`` when a method is
    called through an object (``self.step(x)``, ``obj.step(x)``), with every
    parameter for a ``@staticmethod``; a class call ``Trainer(m)`` fills
    ``Trainer.__init__`` after ``self``."""
    params = list(callee.params)
    node = callee.node
    static = isinstance(node, cst.FunctionDef) and any(
        isinstance(d.decorator, cst.Name) and d.decorator.value == "staticmethod" for d in node.decorators)
    if callee.class_name is not None and not static and params and params[0] in ("self", "cls") \
            and call.func_text and ("." in call.func_text
                                    or (callee.name == "__init__" and call.func_text == callee.class_name)):
        params = params[1:]
    return params


def argument_for(call: "Call", callee: Scope, param: str) -> Optional[cst.BaseExpression]:
    """The argument expression ``call`` passes for ``callee``'s parameter
    ``param`` (positional or keyword), or ``None``."""
    positional = [a for a in call.node.args if a.keyword is None and not a.star]
    params = call_params(call, callee)
    if param in params and params.index(param) < len(positional):
        return positional[params.index(param)].value
    for a in call.node.args:
        if a.keyword is not None and a.keyword.value == param:
            return a.value
    return None


def target_element(binding: "Assign", text: str) -> Optional[int]:
    """The position of ``text`` in the tuple a binding unpacks into
    (``a, b = ...`` -> ``b`` is 1); ``None`` for starred or nested targets."""
    node = binding.node
    target: Optional[cst.BaseExpression] = None
    if isinstance(node, cst.Assign) and len(node.targets) == 1:
        target = node.targets[0].target
    elif isinstance(node, (cst.AnnAssign, cst.NamedExpr)):
        target = node.target
    if not isinstance(target, (cst.Tuple, cst.List)):
        return None
    for i, el in enumerate(target.elements):
        if isinstance(el, cst.StarredElement):
            return None
        if dotted_name(el.value) == text:
            return i
    return None


def nodes_under_if(model: FileModel, root: cst.CSTNode, kind: str, test, *, orelse: bool = False,
                   conditional_expressions: bool = False) -> set[int]:
    """ids of the nodes of ``root``'s subtree inside an ``if`` (and, with
    ``conditional_expressions``, an ``a if t else b``) whose test satisfies
    ``test(node) -> bool``: its body, and its ``else`` part too with ``orelse``.
    Memoised per file, ``root`` and ``kind`` (a name for the test)."""
    key = ("nodes-under-if", kind, id(root))
    found = model.memo.get(key)
    if found is None:
        found = set()
        kinds = (cst.If, cst.IfExp) if conditional_expressions else (cst.If,)
        for n in walk(root):
            if isinstance(n, kinds) and test(n.test):
                for part in (n.body, n.orelse) if orelse else (n.body,):
                    if part is not None:
                        found.update(id(x) for x in walk(part))
        model.memo[key] = found
    return found


def left_off_by_callers(model: "FileModel", callee: Scope, param: str, depth: int = 0) -> bool:
    """Whether every same-file call of the function ``callee`` leaves its
    parameter ``param`` at ``None``/``False``/``0``: it passes such a literal,
    passes nothing over such a default, or passes a parameter of its own
    function that every caller of that function leaves off in turn (up to
    three calls deep). ``False`` when the function has no same-file caller or
    a call passes ``*args``/``**kwargs``. ("What is torch.nn really?"'s
    ``loss_batch(model, loss_func, xb, yb, opt=None)``, whose backward runs
    only ``if opt is not None``, called under ``no_grad`` with no ``opt``.)"""
    callers = model.callers_of(callee)
    if not callers or depth > 2:
        return False
    for site in callers:
        if any(a.star for a in site.node.args):
            return False
        given = argument_for(site, callee, param)
        if given is None:
            if not falsy_literal(param_default(callee, param)):
                return False
            continue
        if falsy_literal(given):
            continue
        outer = model.enclosing_function(site.scope)
        name = given.value if isinstance(given, cst.Name) else None
        if outer is None or name not in outer.params \
                or any(b.kind != "param" for b in model.bindings_of(name, site.scope)) \
                or not left_off_by_callers(model, outer, name, depth + 1):
            return False
    return True


def gate_parameters(model: "FileModel", fact: "_Located") -> set[str]:
    """The parameters ``p`` of the function around ``fact`` that gate it: it
    sits in the body of an ``if p:`` / ``if p is not None:`` (no ``else``
    part counts) in that function."""
    fn = model.enclosing_function(fact.scope)
    if fn is None or not isinstance(fn.node, cst.FunctionDef):
        return set()
    return {p for p in fn.params if id(fact.node) in nodes_under_if(
        model, fn.node, f"gate {p}", lambda test, p=p: _gated_name(test) == p)}


def _gated_name(test: cst.BaseExpression) -> Optional[str]:
    """``p`` for an ``if`` test ``p`` or ``p is not None``."""
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 \
            and isinstance(test.comparisons[0].operator, cst.IsNot) \
            and isinstance(test.comparisons[0].comparator, cst.Name) \
            and test.comparisons[0].comparator.value == "None":
        test = test.left
    return test.value if isinstance(test, cst.Name) else None
