"""TGL005 grad-mode-leak."""

from __future__ import annotations

from itertools import chain
from typing import Iterator, Optional

import libcst as cst

from ..analysis.model import Call, FileModel, GradMode, Loop, Region, Scope
from ..analysis.steps import backward_call, foreign_framework_file, optimizer_step
from ..analysis.summaries import leaves_grad_disabled
from ..analysis.training import has_backward
from ..registry import Finding, Rule

# Context managers whose ``__enter__`` switches grad mode off. ``torch.inference_mode().__enter__()``
# is not here: the guard it enters lives in the (temporary) context object and is released with it
# at the end of the statement, so it switches nothing for later statements (measured, torch 2.13).
_ENTER_DISABLES = frozenset({"torch.no_grad"})
_MAX_CALLER_DEPTH = 2


def _trains(model: FileModel, call: Call) -> bool:
    """A backward that writes ``.grad`` or an optimizer step."""
    b = backward_call(model, call)
    return (b is not None and b.accumulates) or optimizer_step(model, call) is not None


def _file_trains(model: FileModel) -> bool:
    return model.cached("tgl005-file-trains", lambda: any(_trains(model, c) for c in model.calls))


def _bare_enter(model: FileModel, call: Call) -> bool:
    """``torch.no_grad().__enter__()`` (the statement switches grad mode off for good)."""
    return call.method == "__enter__" and isinstance(call.receiver, cst.Call) \
        and model.qualname(call.receiver.func) in _ENTER_DISABLES


def _restores(model: FileModel, order: int, end: int, scope: Scope) -> bool:
    """Whether ``[order, end]`` of ``scope`` switches grad mode back: a bare
    ``set_grad_enabled(True)``/``set_grad_enabled(flag)`` statement, an
    ``__exit__`` call, a ``with`` that enables grad, or the call of a
    same-file training helper that switches grad mode on before it trains
    (``run_train()`` starting each step with ``torch.set_grad_enabled(True)``)."""
    if _enables(model, order, end, scope):
        return True
    calls = [c for c in model.calls_within(order, end) if c.scope is scope]
    return any(c.method == "__exit__" for c in calls) or any(
        _enables_before_training(model, callee) for c in calls for callee in model.resolve_callee(c)
        if not callee.contains(c.order))


def _enables(model: FileModel, order: int, end: int, scope: Scope) -> bool:
    return any(order <= r.order <= end and scope.contains(r.order) and r.mode is not GradMode.DISABLED
               and r.kind in ("statement", "with") for r in model.regions)


def _enables_before_training(model: FileModel, fn: Scope) -> bool:
    """Whether the function ``fn`` switches grad mode on (a statement or a
    ``with``) before its first backward or optimizer step."""
    first = next((c.order for c in model.calls_within(fn.order, fn.end) if _trains(model, c)), None)
    return first is not None and _enables(model, fn.order, first, fn)


def _innermost_scope(model: FileModel, order: int) -> Scope:
    inner = model.module_scope
    for s in model.scopes:
        if s.contains(order) and s.order >= inner.order:
            inner = s
    return inner


def _innermost_loop(model: FileModel, order: int, scope: Scope) -> Optional[Loop]:
    found = None
    for loop in model.loops:
        if loop.scope is scope and loop.contains(order) and (found is None or loop.order > found.order):
            found = loop
    return found


def _continues_to_train(model: FileModel, site: Call, depth: int = 0) -> bool:
    """Whether training runs after the call ``site`` (later in its scope, or in
    a later iteration of a loop around it) with grad not switched back on in
    between; through the function's own same-file callers, two levels up."""
    scope = site.scope
    end = scope.end
    loops = site.loops
    if loops:
        outer = loops[0]
        if has_backward(model, outer.order, outer.end):
            return not _restores(model, outer.order, outer.end, scope)
    if _restores(model, site.order + 1, end, scope):
        return False
    later = [c for c in model.calls_within(site.order + 1, end) if c.scope is scope]
    if any(_trains(model, c) for c in later) or has_backward(model, site.order + 1, end):
        return True
    fn = model.enclosing_function(scope)
    if fn is None or fn.kind != "function" or depth >= _MAX_CALLER_DEPTH:
        return False
    return any(_continues_to_train(model, c, depth + 1) for c in model.callers_of(fn))


def _restored_by_class(model: FileModel, fn: Scope) -> bool:
    """A method paired with another method of its class that switches grad
    back (``__enter__``/``__exit__``, ``on_eval_start``/``on_eval_end``)."""
    if fn.name in ("__enter__", "__aenter__"):
        return True
    info = model.classes.get(fn.class_name or "")
    if info is None:
        return False
    return any(m is not fn and _restores(model, m.order, m.end, m) for m in info.methods.values())


def _library_module(model: FileModel) -> bool:
    """A module that only defines things (imports, functions, classes,
    constants) and has no ``__main__`` block: code runs when it is imported."""
    for stmt in model.module.body:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            continue
        if isinstance(stmt, cst.If):
            return False  # ``if __name__ == "__main__":`` or configuration-dependent code: a script
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, (cst.Import, cst.ImportFrom, cst.Assign, cst.AnnAssign, cst.Pass)):
                    continue
                if isinstance(small, cst.Expr) and isinstance(small.value, (cst.SimpleString,
                                                                            cst.ConcatenatedString)):
                    continue
                if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) \
                        and model.qualname(small.value.func) == "torch.set_grad_enabled":
                    continue
                return False
            continue
        return False
    return any(isinstance(s, (cst.FunctionDef, cst.ClassDef)) for s in model.module.body)


class GradModeLeak(Rule):
    """A bare ``torch.set_grad_enabled(False)`` or ``torch.no_grad().__enter__()``
    that is never switched back, so code running after it (the callers of the
    function, the next iteration of the loop, the importers of the module)
    goes on with grad mode off.

    Rests on: ``torch.set_grad_enabled`` ("can be used as a context-manager or
    as a function": called as a function it sets grad mode until changed),
    ``torch.no_grad`` (its ``__exit__`` restores the previous mode), and the
    autograd notes "Locally disabling gradient computation" and "Grad Modes".
    """

    code = "TGL005"
    name = "grad-mode-leak"
    summary = "bare `set_grad_enabled(False)` / `no_grad().__enter__()` never switched back"
    probe = "grad-mode-leak"
    prefilter = (("set_grad_enabled", "__enter__"),)
    ast_prefilter = "grad-switch-statement"  # a `set_grad_enabled(...)` statement or `no_grad().__enter__()`
    docs = """
## What it does
Checks for grad mode switched off by a statement rather than a `with`
block, `torch.set_grad_enabled(False)` or `torch.no_grad().__enter__()`,
that is never switched back (no later `torch.set_grad_enabled(True)` or
`torch.set_grad_enabled(prev)`, no `try`/`finally` restore, no `__exit__`):

- in a function whose callers go on to train (later in the caller, in a
  later iteration of a loop around the call, or in a function with no
  same-file caller that does not train itself, such as an `evaluate()`
  method);
- in a loop body that trains (the next iteration starts with grad off);
- at the top level of a library module (only imports and definitions):
  importing it switches grad mode off for the whole program.

It stays silent on `with torch.no_grad():` and `with
torch.set_grad_enabled(False):` blocks, on `prev = torch.is_grad_enabled()
... torch.set_grad_enabled(prev)`, on a `try`/`finally` restore, on a
non-literal flag (`torch.set_grad_enabled(is_train)`), on a method whose
class switches grad back in another method (`__enter__`/`__exit__`,
start/end hooks), on a function decorated with `@torch.no_grad()` (the
decorator restores the mode on return), on module-level code in an
inference script, and on `torch.inference_mode().__enter__()` on a
temporary: the guard is released with the temporary at the end of the
statement, so it changes nothing (measured on torch 2.13).

## Why is this bad?
Called as a function, `torch.set_grad_enabled(False)` sets grad mode for
the thread until something sets it again; `no_grad().__enter__()` does the
same and only `__exit__` undoes it. An evaluation helper written this way
returns with grad mode off, so the next training forward records no graph
and `loss.backward()` raises `RuntimeError: element 0 of tensors does not
require grad and does not have a grad_fn` (asteroid-team/asteroid#643;
kuprel/min-dalle switched autograd off for every importer). Where the
training code wraps its loss in `torch.enable_grad()` the error disappears
but every other forward silently stops recording.

## Example
```python
def evaluate(model, x, y):
    model.eval()
    torch.set_grad_enabled(False)
    return (model(x).argmax(1) == y).float().mean().item()


for epoch in range(epochs):
    model.train()
    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    optimizer.step()
    acc = evaluate(model, x_val, y_val)
```

## Use instead
```python
@torch.no_grad()
def evaluate(model, x, y):
    model.eval()
    return (model(x).argmax(1) == y).float().mean().item()


for epoch in range(epochs):
    model.train()
    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    optimizer.step()
    acc = evaluate(model, x_val, y_val)
```

## References
- [torch.set_grad_enabled](https://pytorch.org/docs/stable/generated/torch.set_grad_enabled.html)
- [torch.no_grad](https://pytorch.org/docs/stable/generated/torch.no_grad.html)
- [torch.is_grad_enabled](https://pytorch.org/docs/stable/generated/torch.is_grad_enabled.html)
- [Locally disabling gradient computation](https://pytorch.org/docs/stable/notes/autograd.html#locally-disabling-gradient-computation)
"""

    def check(self, model: FileModel) -> Iterator[Finding]:
        if foreign_framework_file(model):
            return
        reported: set[int] = set()
        for finding, node in chain(self._functions(model), self._loops(model), self._import_time(model)):
            if id(node) not in reported:  # a switch in a helper's loop is one finding
                reported.add(id(node))
                yield finding

    @staticmethod
    def _functions(model: FileModel) -> Iterator[tuple[Finding, cst.CSTNode]]:
        for fn in model.scopes:
            if fn.kind != "function" or fn.decorator_region is not None:
                continue
            region = leaves_grad_disabled(model, fn)
            if region is None or region.api not in ("torch.set_grad_enabled", *_ENTER_DISABLES):
                continue
            if _restored_by_class(model, fn):
                continue
            callers = model.callers_of(fn)
            if callers:
                if not any(_continues_to_train(model, c) for c in callers):
                    continue
            elif not _file_trains(model) or has_backward(model, fn.order, fn.end):
                continue
            node = _statement_call(region)
            yield Finding.from_text(node, (
                f"`{fn.qualname}()` leaves grad mode off: a bare `{_api_text(model, region)}` is never switched "
                "back before it returns, so its callers go on with grad disabled, the next training forward "
                "records no graph and `backward()` raises \"element 0 of tensors does not require grad\"; "
                "use `with torch.no_grad():` or decorate the function with `@torch.no_grad()`")), node

    @staticmethod
    def _loops(model: FileModel) -> Iterator[tuple[Finding, cst.CSTNode]]:
        switches: list[tuple[cst.CSTNode, int, str]] = []
        for r in model.regions:
            if r.kind == "statement" and r.mode is GradMode.DISABLED:
                switches.append((_statement_call(r), r.order, "torch.set_grad_enabled(False)"))
        for c in model.calls:
            if _bare_enter(model, c):
                switches.append((c.node, c.order, f"{model.module.code_for_node(c.receiver)}.__enter__()"))
        for node, order, text in switches:
            scope = _innermost_scope(model, order)
            loop = _innermost_loop(model, order, scope)
            if loop is None:
                continue
            train_loop = next((lp for lp in _chain(loop) if has_backward(model, lp.order, lp.end)), None)
            if train_loop is None or _restores(model, train_loop.order, train_loop.end, scope):
                continue
            yield Finding.from_text(node, (
                f"`{text}` in a training loop is never switched back: the next iteration's forward records "
                "no graph and `backward()` raises \"element 0 of tensors does not require grad\"; wrap the "
                "evaluation in `with torch.no_grad():` instead")), node

    @staticmethod
    def _import_time(model: FileModel) -> Iterator[tuple[Finding, cst.CSTNode]]:
        top = [r for r in model.regions if r.kind == "statement" and r.mode is GradMode.DISABLED
               and _innermost_scope(model, r.order) is model.module_scope
               and any(r.node is small for s in model.module.body if isinstance(s, cst.SimpleStatementLine)
                       for small in s.body)]
        if not top or _restores(model, top[-1].order + 1, model.module_scope.end, model.module_scope):
            return
        if not _library_module(model):
            return
        node = _statement_call(top[-1])
        yield Finding.from_text(node, (
            "`torch.set_grad_enabled(False)` at the top of a library module turns grad mode off on import: "
            "it stays off for the whole program, so any training code of the importer records "
            "no graph; use `@torch.no_grad()` on the functions that need it")), node


def _chain(loop: Loop) -> Iterator[Loop]:
    """``loop`` and its enclosing loops of the same scope, innermost first."""
    lp: Optional[Loop] = loop
    while lp is not None and lp.scope is loop.scope:
        yield lp
        lp = lp.parent


def _statement_call(region: Region) -> cst.CSTNode:
    """The call of a statement region (``torch.set_grad_enabled(False)``), or its node."""
    node = region.node
    if isinstance(node, cst.Expr):
        return node.value
    return node


def _api_text(model: FileModel, region: Region) -> str:
    node = region.node
    if isinstance(node, cst.Expr):
        node = node.value
    if isinstance(node, cst.Call):
        text = model.module.code_for_node(node)
        if len(text) <= 50:
            return text
    return f"{region.api}(False)"
