"""TGL203 functional-dropout-ignores-eval."""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from ..analysis.literals import is_literal, is_zero_literal
from ..analysis.model import Call, FileModel, GradMode, names_in
from ..analysis.names import dotted_name
from ..analysis.module_class_facts import (enclosing_method, forward_methods, is_torch_module_class, nodes_under_if,
                                           self_name)
from ..analysis.torch_api import DROPOUT_MODULES, FUNCTIONAL_DROPOUTS, SDPA, TORCH_DROPOUTS
from ..registry import Finding, Rule

_SDPA_DROPOUT_POS = 4  # (query, key, value, attn_mask, dropout_p, ...)


def _mentions_training(node: Optional[cst.CSTNode]) -> bool:
    """Whether an expression reads something called ``training`` (``self.training``,
    ``training``, ``is_training``, ``self.cfg.training``)."""
    return any("training" in n.rsplit(".", 1)[-1] for n in names_in(node))


def _rate_from_caller(p: Optional[cst.BaseExpression], fn: cst.CSTNode) -> bool:
    """Whether the dropout rate ``p`` is a parameter of the method ``fn`` that every
    call must pass (no default) or that defaults to zero: the caller picks the
    rate per call (pytorch_RVAE's ``forward(self, ..., drop_prob)``, called with
    ``0.`` to validate and sample), not the module's mode."""
    if not isinstance(p, cst.Name) or not isinstance(fn, cst.FunctionDef):
        return False
    for param in [*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params]:
        if param.name.value == p.value:
            return param.default is None or is_zero_literal(param.default)
    return False


def _built_per_call(model: FileModel, c: Call, info, method) -> bool:
    """Whether the dropout module ``c`` builds is a new one on every forward:
    built in ``forward`` or a method it calls (not in ``__init__``), and not
    kept on the module (``self.drop = nn.Dropout(p)`` built lazily is a
    submodule ``.eval()`` reaches): ``nn.Dropout(0.25)(h)``, or an
    ``nn.Sequential(self.fc, nn.Dropout(0.5), ...)`` assembled per call."""
    if method.name == "__init__" or not any(m is method for m in forward_methods(model, info)):
        return False
    stmt = c.statement
    return not (isinstance(stmt, (cst.Assign, cst.AnnAssign)) and any(
        (dotted_name(t.target) or "").startswith("self.")
        for t in (stmt.targets if isinstance(stmt, cst.Assign) else [stmt])))


def _has_star(call: cst.Call) -> bool:
    return any(a.star for a in call.args)


def _append_keyword(call: cst.Call, keyword: str, value: cst.BaseExpression) -> cst.Call:
    """``call`` (on one line) with ``keyword=value`` appended as its last argument."""
    args = list(call.args)
    if args and isinstance(args[-1].comma, cst.Comma):  # f(x, ) -> f(x, training=...)
        args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    new = cst.Arg(value=value, keyword=cst.Name(keyword),
                  equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                        whitespace_after=cst.SimpleWhitespace("")))
    return call.with_changes(args=[*args, new])


class FunctionalDropoutIgnoresEval(Rule):
    """Functional dropout inside an ``nn.Module`` method that does not follow the
    module's train/eval mode.

    Rests on: ``torch.nn.functional.dropout`` (``training`` defaults to
    ``True``: "apply dropout if is True"), ``torch.nn.Module.eval`` (it sets
    ``self.training``; functional calls never read it),
    ``torch.nn.functional.scaled_dot_product_attention`` ("dropout_p ... Dropout
    probability; if greater than 0.0, dropout is applied", with the note that
    callers must pass 0.0 in evaluation), and ``torch.nn.Dropout``.
    """

    code = "TGL203"
    name = "functional-dropout-ignores-eval"
    probe = "eval-spread"
    fix_availability = "sometimes"  # not on calls that span several lines
    summary = "`F.dropout` / SDPA `dropout_p` in a module method not tied to `self.training`"
    prefilter = (("dropout", "Dropout", "scaled_dot_product_attention"),)
    ast_prefilter = "functional-dropout-call"  # a call of a functional dropout or SDPA
    docs = """
## What it does
Inside a method of a `torch.nn.Module` subclass, checks for:

- `torch.nn.functional.dropout` (and `dropout1d/2d/3d`, `alpha_dropout`,
  `feature_alpha_dropout`) called with **no** `training` argument (keyword or
  third positional);
- `torch.dropout(x, p, True)` (and the other `torch.*dropout` functions) with
  a literal `True`;
- `F.scaled_dot_product_attention(..., dropout_p=E)` where `E` is not a
  literal 0 and does not depend on `training` (directly, or through the local
  variable it is read from), outside an `if self.training:` branch;
- `nn.Dropout(p)` (and the other `torch.nn` dropout modules) built in
  `forward` (or a method it calls) and not kept on the module:
  `nn.Dropout(0.25)(x)`, or an `nn.Sequential(self.fc, nn.Dropout(0.5))`
  assembled per call. Each call makes a new module in training mode, which
  `.eval()` never reaches.

It stays silent on `training=self.training` or any other non-literal
`training=`, on an explicit `training=True` (dropout kept at inference on
purpose: Monte-Carlo dropout, the Tacotron 2 prenet), on `p=0`, on a rate the
method takes as a parameter without a default (or defaulting to 0: the caller
picks it per call, 0 to evaluate), on calls
gated by an `if` on `training`, on calls that pass `*args`/`**kwargs`, on
calls that run with gradients off (a sampling method decorated with
`@torch.no_grad()`: latent diffusion's `noise_dropout` applies dropout to the
sampling noise on purpose), and on calls outside module methods (a
data-augmentation function).

## Why is this bad?
`model.eval()` switches `nn.Dropout` *modules* off by setting their
`training` flag. The functional form never reads that flag: `F.dropout`'s
`training` argument defaults to `True`, and SDPA applies `dropout_p` whenever
it is above 0. After `model.eval()` the model still zeroes activations at
random, so validation metrics are noisy and too low and predictions differ
from call to call (measured: std 0.173 over 20 repeated eval predictions,
0 with the fix; an SDPA `dropout_p=self.p` gives max |Δ| 0.92 between two
eval passes). Real reports: karpathy/nanoGPT PR #240, pytorch/pytorch #26338,
rixwew/pytorch-fm #21, delip/PyTorchNLPBook #28.

## Example
```python
import torch.nn.functional as F
from torch import nn


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(F.dropout(x, p=0.5))
```

## Use instead
```python
import torch.nn.functional as F
from torch import nn


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(F.dropout(x, p=0.5, training=self.training))
```

## Fix safety
The autofix appends `training=self.training` to a functional dropout call,
replaces the literal `True` of `torch.dropout(x, p, True)` with
`self.training`, and rewrites SDPA's `dropout_p=E` as
`dropout_p=E if self.training else 0.0`. Training behaviour is unchanged;
evaluation becomes deterministic. It is safe unless the model was *meant* to
keep dropout at inference without saying so (then write `training=True`).

## References
- [torch.nn.functional.dropout](https://pytorch.org/docs/stable/generated/torch.nn.functional.dropout.html)
- [torch.nn.functional.scaled_dot_product_attention](https://pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html)
- [torch.nn.Module.eval](https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.eval)
- [torch.nn.Dropout](https://pytorch.org/docs/stable/generated/torch.nn.Dropout.html)
"""

    @staticmethod
    def _gated(model: FileModel, method_node: cst.CSTNode, node: cst.CSTNode) -> bool:
        """Whether ``node`` (a call or statement of the method) sits in a branch of an
        ``if`` or conditional expression that tests ``training``."""
        return id(node) in nodes_under_if(model, method_node, "training", _mentions_training, orelse=True,
                                          conditional_expressions=True)

    def _depends_on_training(self, model: FileModel, expr: cst.BaseExpression, c: Call,
                             method_node: cst.CSTNode) -> bool:
        """``expr`` reads ``training``, or a local name bound (anywhere in the
        scope) from an expression that does, or in a branch that tests it."""
        if _mentions_training(expr):
            return True
        for name in names_in(expr):
            if "." in name:
                continue
            for b in model.bindings_of(name, c.scope):
                if b.kind != "param" and (_mentions_training(b.value)
                                          or self._gated(model, method_node, b.statement)):
                    return True
        return False

    def check(self, model: FileModel) -> Iterator[Finding]:
        for c in model.calls:
            qn = c.qualname or ""
            if qn not in FUNCTIONAL_DROPOUTS and qn not in TORCH_DROPOUTS and qn != SDPA and qn not in DROPOUT_MODULES:
                continue
            if _has_star(c.node):
                continue
            found = enclosing_method(model, c.scope)
            if found is None:
                continue
            info, method = found
            if not is_torch_module_class(model, info.name, lenient=True):
                continue
            me = self_name(method)
            if me is None or self._gated(model, method.node, c.node):
                continue
            if model.grad_mode(c) is GradMode.DISABLED:
                continue  # a sampling method under no_grad (latent diffusion's ``noise_dropout``): deliberate
            shown = c.func_text or qn
            training = cst.Attribute(value=cst.Name(me), attr=cst.Name("training"))
            if qn == SDPA:
                p = c.arg(_SDPA_DROPOUT_POS, "dropout_p")
                if p is None or is_zero_literal(p) or self._depends_on_training(model, p, c, method.node):
                    continue
                value = p
                if isinstance(value, (cst.IfExp, cst.Lambda)):
                    value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
                new = cst.IfExp(test=training, body=value, orelse=cst.Float("0.0"))
                text = model.module.code_for_node(p)
                msg = (f"`{shown}(..., dropout_p={text if len(text) <= 30 else '...'})` applies attention dropout "
                       f"in eval mode too: SDPA does not know the module's mode; pass "
                       f"`dropout_p=... if {me}.training else 0.0`")
                yield Finding(c.node, msg) if "\n" in text else Finding(c.node, msg, fix=(p, new))
                continue
            if qn in DROPOUT_MODULES:
                if not _built_per_call(model, c, info, method):
                    continue
                p = c.arg(0, "p")
                if is_zero_literal(p) or (p is not None and _mentions_training(p)) \
                        or _rate_from_caller(p, method.node):
                    continue
                yield Finding(c.node, (
                    f"`{shown}(...)` builds a new dropout module, in training mode, on every call of the method, "
                    f"so it keeps dropping activations after `{me}.eval()`; build it once in `__init__` "
                    f"(`{me}.dropout = {shown}(...)`) or call `F.dropout(..., training={me}.training)`"))
                continue
            p = c.arg(1, "p")
            if is_zero_literal(p) or (p is not None and _mentions_training(p)) or _rate_from_caller(p, method.node):
                continue
            if qn in TORCH_DROPOUTS:
                flag = c.arg(2, "train")
                if not is_literal(flag, True):
                    continue
                yield Finding(c.node, f"`{shown}(..., True)` drops activations in eval mode too: it does not "
                                      f"follow `{me}.eval()`; pass `{me}.training`", fix=(flag, training))
                continue
            if c.arg(2, "training") is not None:
                continue
            msg = (f"`{shown}(...)` has no `training` argument, so it defaults to `training=True` and keeps "
                   f"dropping activations after `.eval()`; pass `training={me}.training`")
            if "\n" in model.module.code_for_node(c.node):
                # a replacement spanning lines would lose the enclosing indentation
                yield Finding(c.node, msg)
            else:
                yield Finding(c.node, msg, fix=(c.node, _append_keyword(c.node, "training", training)))
