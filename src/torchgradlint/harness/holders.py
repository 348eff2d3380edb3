"""Which variable of the user's program holds a graph, and on which line it keeps one (imports torch).

:func:`graph_holders` measures, for each name bound in the given frames (locals, or a
script's globals), the autograd graph nodes reachable from the tensors it holds,
directly or inside lists, tuples, dicts, sets and deques (two levels deep) or in the
``__dict__`` of a plain object. A probe compares these counts between checkpoints:
the binding whose count grows keeps a graph alive across steps.

:func:`keeping_lines` reads a function's bytecode to name the line that stores into
that binding: ``xs.append(t)`` (or ``extend``/``insert``/``add``/...), ``d[k] = t``,
``total += t`` / ``total = total + t``.
"""

from __future__ import annotations

import collections
import dis
import os
import sys
from typing import Any, Iterable, Iterator

import torch

from .instrument import is_user_file

_CONTAINERS = (list, tuple, dict, set, frozenset, collections.deque)
_STORE_METHODS = {"append", "extend", "insert", "appendleft", "extendleft", "add", "update", "setdefault",
                  "__setitem__", "__iadd__"}
_LOADS = {"LOAD_FAST", "LOAD_NAME", "LOAD_GLOBAL", "LOAD_DEREF", "LOAD_CLASSDEREF"}
_STORES = {"STORE_FAST", "STORE_NAME", "STORE_GLOBAL", "STORE_DEREF"}


def _user_object(value: Any) -> bool:
    """An instance of a class defined in the user's program (its ``__dict__`` is searched)."""
    if isinstance(value, type) or not hasattr(value, "__dict__"):
        return False
    module = sys.modules.get(type(value).__module__)
    path = getattr(module, "__file__", None)
    return bool(path) and is_user_file(path)


def tensors_in(value: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """Tensors held by ``value``: itself, inside containers (two levels) or a user object's attributes."""
    if isinstance(value, torch.Tensor):
        yield value
        return
    if depth >= 2 or isinstance(value, (str, bytes, torch.nn.Module)):
        return
    if isinstance(value, dict):
        for v in list(value.values())[:10000]:
            yield from tensors_in(v, depth + 1)
    elif isinstance(value, _CONTAINERS):
        for v in list(value)[:10000]:
            yield from tensors_in(v, depth + 1)
    elif depth == 0 and _user_object(value):
        for v in list(vars(value).values()):
            yield from tensors_in(v, depth + 1)


def reachable_nodes(fns: Iterable[Any], seen: dict) -> int:
    """Count autograd nodes reachable from ``fns`` not already in ``seen`` (which it extends)."""
    stack = [fn for fn in fns if fn is not None]
    n = 0
    while stack:
        fn = stack.pop()
        if id(fn) in seen:
            continue
        seen[id(fn)] = fn  # keep alive so ids stay unique while counting
        n += 1
        for nxt, _ in getattr(fn, "next_functions", ()):
            if nxt is not None and id(nxt) not in seen:
                stack.append(nxt)
    return n


def graph_leaves(roots: Any) -> Iterator[torch.Tensor]:
    """The leaf tensors the graphs of ``roots`` (tensors) accumulate gradients
    into: the ``variable`` of every ``AccumulateGrad`` node reached, once each."""
    stack = [t.grad_fn for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    seen: set[int] = set()
    while stack:
        fn = stack.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        var = getattr(fn, "variable", None)
        if isinstance(var, torch.Tensor):
            yield var
        for nxt, _ in getattr(fn, "next_functions", ()):
            if nxt is not None and id(nxt) not in seen:
                stack.append(nxt)


def graph_holders(frames: Iterable[Any]) -> dict[str, int]:
    """``{"path:function:name": graph nodes reachable from what the name holds}`` for the user's frames.

    Only bindings holding at least one node are listed; a node shared by two bindings
    is counted for each.
    """
    out: dict[str, int] = {}
    for frame in frames:
        code = frame.f_code
        try:
            items = list(frame.f_locals.items())
        except Exception:  # pragma: no cover - exotic frames
            continue
        for name, value in items:
            if name.startswith("__") or isinstance(value, type) or callable(value) and not isinstance(
                    value, torch.Tensor):
                continue
            fns = []
            for t in tensors_in(value):
                try:
                    fn = t.grad_fn
                except Exception:  # pragma: no cover
                    fn = None
                if fn is not None:
                    fns.append(fn)
            if fns:
                n = reachable_nodes(fns, {})
                if n:
                    out[f"{os.path.abspath(code.co_filename)}:{code.co_name}:{code.co_firstlineno}:{name}"] = n
    return out


def holder_parts(key: str) -> tuple[str, str, int, str]:
    """``(path, function, first_line, name)`` of a :func:`graph_holders` key."""
    rest, name = key.rsplit(":", 1)
    rest, first = rest.rsplit(":", 1)
    path, func = rest.rsplit(":", 1)
    return path, func, int(first), name


def _codes(code: Any) -> Iterator[Any]:
    yield code
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            yield from _codes(const)


def keeping_lines(code: Any, name: str) -> list[int]:
    """Lines of ``code`` (nested code objects included) that store something into ``name``'s value.

    ``name.append(...)``-style method calls, ``name[k] = ...``, and rebinding ``name``
    to an expression computed from itself (``name += t``, ``name = name + t``). Sorted.
    """
    lines: set[int] = set()
    for co in _codes(code):
        ins = list(dis.get_instructions(co))
        line = co.co_firstlineno
        lines_of = []
        for i in ins:
            if i.starts_line is not None:
                line = i.starts_line
            lines_of.append(line)
        for k, i in enumerate(ins):
            if i.opname in _LOADS and i.argval == name:
                nxt = ins[k + 1:k + 4]
                for j in nxt:
                    if j.opname in ("LOAD_METHOD", "LOAD_ATTR") and j.argval in _STORE_METHODS:
                        lines.add(lines_of[k])
                        break
                    if j.opname == "STORE_SUBSCR":
                        lines.add(lines_of[k])
                        break
                    if j.opname not in ("LOAD_CONST", "BINARY_SUBSCR") and j.opname not in _LOADS:
                        break
            if i.opname in _STORES and i.argval == name and k and ins[k - 1].opname in ("BINARY_OP", "INPLACE_ADD",
                                                                                          "BINARY_ADD"):
                start = k
                while start > 0 and lines_of[start - 1] == lines_of[k]:
                    start -= 1
                if any(j.opname in _LOADS and j.argval == name for j in ins[start:k]):
                    lines.add(lines_of[k])
    return sorted(lines)


def code_for(frames: Iterable[Any], path: str, func: str, first: int) -> Any:
    """The code object of the frame among ``frames`` that matches a holder key, else ``None``."""
    for f in frames:
        c = f.f_code
        if c.co_name == func and c.co_firstlineno == first and os.path.abspath(c.co_filename) == path:
            return c
    return None
