"""TGL303 softmax-into-ce-loss."""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from ..analysis.model import Call, FileModel
from ..analysis.modes import unwrap
from ..analysis.names import dotted_name
from ..analysis.probabilities import ProbabilityResolver
from ..analysis.torch_api import BCE_LOGITS, CE, KL, LOGIT_LOSS_FUNCTIONS, LOGIT_LOSS_MODULES, NLL, SIGMOID, SOFTMAX
from ..registry import Finding, Rule

#: which probabilities each loss must not be fed (a sigmoid squashes every logit into (0, 1) as a
#: softmax does: cross-entropy's log_softmax of them has the same floor)
_WRONG_INPUT = {CE: (SOFTMAX, SIGMOID), NLL: (SOFTMAX, SIGMOID), BCE_LOGITS: (SIGMOID,), KL: (SOFTMAX,)}


def _loss_kind(resolver: ProbabilityResolver, call: Call) -> Optional[str]:
    """Which loss ``call`` computes: a functional loss or an instance of a loss module."""
    if call.qualname in LOGIT_LOSS_FUNCTIONS:
        return LOGIT_LOSS_FUNCTIONS[call.qualname]
    if call.qualname and call.qualname.startswith("torch."):
        return None
    ctors = resolver.constructors(call.node.func, call)
    if not ctors:
        return None
    kinds = {LOGIT_LOSS_MODULES.get(resolver.model.qualname(c.func) or "") for c, _ in ctors}
    return kinds.pop() if len(kinds) == 1 else None


#: library trainers that compute ``loss_fn(model(x), y)`` themselves: (model position, loss position)
_LIBRARY_TRAINERS = {"ignite.engine.create_supervised_trainer": (0, 2)}


def _library_trainer_kinds(resolver: ProbabilityResolver, call: Call) -> Optional[tuple[str, str]]:
    """``(loss kind, probability kind)`` when ``call`` hands a library trainer a
    model whose output is a probability and a loss that expects logits
    (``create_supervised_trainer(model, optimizer, nn.CrossEntropyLoss())``)."""
    positions = _LIBRARY_TRAINERS.get(call.qualname or "")
    if positions is None:
        return None
    net, loss_fn = call.arg(positions[0], "model"), call.arg(positions[1], "loss_fn")
    if net is None or loss_fn is None:
        return None
    qn = resolver.model.qualname(loss_fn) or ""
    if qn in LOGIT_LOSS_FUNCTIONS:  # ``F.cross_entropy`` handed over as a function
        loss = LOGIT_LOSS_FUNCTIONS[qn]
    else:
        ctors = resolver.constructors(loss_fn, call)
        kinds = {LOGIT_LOSS_MODULES.get(resolver.model.qualname(c.func) or "") for c, _ in ctors or ()}
        loss = kinds.pop() if len(kinds) == 1 else None
    kind = resolver.module_kind(net, call) if loss is not None else None
    return (loss, kind) if loss is not None and kind in _WRONG_INPUT[loss] else None


def _loss_candidates(model: FileModel):
    """A cheap test of which calls may call a loss module instance, so that only those are resolved:
    the callee is bound to a loss constructor somewhere in the file (directly, or through a name that
    is bound to one or is a parameter defaulting to one), or is a parameter of its function when the
    file builds a loss module at all."""
    texts: set[str] = set()
    for a in model.assigns:
        value = unwrap(a.value)
        if isinstance(value, cst.Call) and (model.qualname(value.func) or "") in LOGIT_LOSS_MODULES:
            texts.update(t.text for t in a.targets if t.text)
    for scope in model.scopes:
        node = scope.node
        if isinstance(node, cst.FunctionDef):
            for p in [*node.params.posonly_params, *node.params.params, *node.params.kwonly_params]:
                if isinstance(p.default, cst.Call) and (model.qualname(p.default.func) or "") in LOGIT_LOSS_MODULES:
                    texts.add(p.name.value)
    if not texts:
        return lambda call: False
    for a in model.assigns:
        if isinstance(a.value, cst.Name) and a.value.value in texts:
            texts.update(t.text for t in a.targets if t.text)

    def candidate(call: Call) -> bool:
        text = call.func_text or ""
        if text in texts:
            return True
        fn = model.enclosing_function(call.scope)
        return fn is not None and text in fn.params
    return candidate


def _shown(model: FileModel, node: cst.CSTNode) -> str:
    text = model.module.code_for_node(node)
    if len(text) <= 40:
        return f"`{text}`"
    if isinstance(node, cst.Call):  # ``torch.gather(inp, 1, target.view(-1, 1)).squeeze(1)``: name its head
        head = dotted_name(node.func)
        if head is not None and len(head) <= 40:
            return f"`{head}(...)`"
        if isinstance(node.func, cst.Attribute) and isinstance(node.func.value, cst.Call):
            return _shown(model, node.func.value)
    return "the input"


class SoftmaxIntoCeLoss(Rule):
    """Probabilities fed to a loss that expects logits (or log-probabilities).

    Rests on: ``torch.nn.CrossEntropyLoss`` / ``torch.nn.functional.cross_entropy`` ("The input is
    expected to contain the unnormalized logits for each class"), ``torch.nn.NLLLoss`` ("The input
    ... is expected to contain log-probabilities"), ``torch.nn.BCEWithLogitsLoss`` ("combines a Sigmoid
    layer and the BCELoss in one single class"), ``torch.nn.KLDivLoss`` ("the argument input [is]
    expected to be in the log-space") and ``torch.nn.functional.log_softmax`` ("While
    mathematically equivalent to log(softmax(x)), doing these two operations separately is slower and
    numerically unstable").
    """

    code = "TGL303"
    name = "softmax-into-ce-loss"
    summary = ("softmax/sigmoid probabilities passed to CrossEntropyLoss/NLLLoss/*WithLogits, softmax into "
               "KLDivLoss's input, or log(softmax())")
    probe = "probability-input"
    # a probability source, and a loss that takes logits or a log (``log as`` covers ``from torch import
    # log as ln``)
    prefilter = (("softmax", "Softmax", "sigmoid", "Sigmoid", "expit"),
                 ("cross_entropy", "CrossEntropyLoss", "nll_loss", "NLLLoss", "with_logits", "WithLogits", "log(",
                  ".log()", "log as", "kl_div", "KLDivLoss"))
    ast_prefilter = "probabilities-into-loss"  # a softmax/sigmoid call and a logits loss or log call
    docs = """
## What it does
Checks the input (first argument) of `nn.CrossEntropyLoss` instances and
`F.cross_entropy`, and of `nn.NLLLoss` / `F.nll_loss`, for a softmax or
sigmoid output: `F.softmax`, `torch.softmax`, `x.softmax(dim)`,
`torch.sigmoid`, an `nn.Softmax` / `nn.Sigmoid` module, a `Sequential` ending
in one, or a model whose `forward` always returns one (or returns a tuple
whose element the loss takes: `score, code = disc(x)`), defined in the same
file or in another file of the project (`from networks import Policy`,
through the project index), a `Sequential(*layers)` whose list ends in one,
or what a same-file factory (`get_model()`) returns — followed
through local variables, loop variables over the probabilities, `self`
attributes, arguments of same-file callers, `model.forward(x)`, wrappers
(`nn.DataParallel(Net())`) and a checkpoint the file restores from what it
saved itself (`torch.save([gen, disc], path)` ... `gen, disc =
torch.load(path)`). It also checks the input of `nn.BCEWithLogitsLoss` /
`F.binary_cross_entropy_with_logits` for a sigmoid output, and flags
the input of `nn.KLDivLoss` / `F.kl_div` (log-probabilities) for a softmax
output (a distillation loss given the student's probabilities), and flags
`torch.log(softmax(...))` / `softmax(...).log()`, also of probabilities
picked from a softmax output (`-torch.log(torch.gather(probs, 1, target))`
in a loss helper, as the chatbot tutorial writes its masked NLL), and a model
ending in a softmax handed with a logits loss to a library trainer that
computes `loss_fn(model(x), y)` itself (PyTorch Ignite's
`create_supervised_trainer(model, optimizer, loss_fn)`).

It stays silent on softmax fed to `MSELoss`, `KLDivLoss` (as the target: the
teacher's probabilities) or
metrics, on softmax used for `argmax`, on `log_softmax` into CE (harmless),
on probabilities passed as the *target* (soft labels, distillation), and on a
model whose `forward` returns logits in training and probabilities only in
another branch.

## Why is this bad?
`cross_entropy` applies `log_softmax` to its input. Given probabilities it
computes the softmax of probabilities: the loss can never fall below a floor
(1.461 for 10 classes), and the gradient of a confidently wrong sample is
about 10,000x smaller than with logits (measured 1.19e-4 vs 1.414), so
training slows to a crawl and ends less accurate (train accuracy 0.893 vs
0.997 on the same data). `NLLLoss` expects log-probabilities; fed
probabilities it optimises the wrong quantity. A sigmoid into cross-entropy
(a 10-way code head ending in `nn.Sigmoid`, as InfoGAN tutorials write it)
squashes every logit into (0, 1): the same floor of 1.461 nats for 10
classes. A sigmoid into
`BCEWithLogitsLoss` is squashed twice (gradient 4,080x smaller, floor 0.693).
`log(softmax(x))` underflows to `-inf` for confident logits and gives NaN
gradients; `log_softmax` is exact. `kl_div(input, target)` computes
`target * (log(target) - input)`: given probabilities as its input it is no
divergence. A 10-class student distilled from soft targets for 300 Adam steps
reports a loss of -2.41 while its true KL divergence to the teacher is 3.72
nats (0.0000 with `log_softmax`), and it grows confident where the teacher is
not (mean top probability 0.84 against the teacher's 0.15).

## Example
```python
import torch.nn.functional as F

probs = F.softmax(model(x), dim=1)
loss = F.cross_entropy(probs, y)
```

## Use instead
```python
import torch.nn.functional as F

logits = model(x)
loss = F.cross_entropy(logits, y)
probs = F.softmax(logits, dim=1)  # for metrics only
```

## References
- [torch.nn.CrossEntropyLoss](https://pytorch.org/docs/stable/generated/torch.nn.CrossEntropyLoss.html)
- [torch.nn.NLLLoss](https://pytorch.org/docs/stable/generated/torch.nn.NLLLoss.html)
- [torch.nn.BCEWithLogitsLoss](https://pytorch.org/docs/stable/generated/torch.nn.BCEWithLogitsLoss.html)
- [torch.nn.KLDivLoss](https://pytorch.org/docs/stable/generated/torch.nn.KLDivLoss.html)
- [torch.nn.functional.log_softmax](https://pytorch.org/docs/stable/generated/torch.nn.functional.log_softmax.html)
"""

    def check(self, model: FileModel) -> Iterator[Finding]:
        resolver = ProbabilityResolver(model)
        candidates = _loss_candidates(model)
        for call in model.calls:
            handed = _library_trainer_kinds(resolver, call)
            if handed is not None:
                loss, kind = handed
                shown = _shown(model, call.arg(0, "model"))
                yield Finding(call.node, (
                    f"{shown} outputs {kind} probabilities and `{call.func_text}` feeds them to its "
                    f"{'cross-entropy' if loss == CE else 'NLL' if loss == NLL else '*WithLogits'} loss, which "
                    "expects logits: the loss has a floor and the gradients of confident mistakes shrink; end "
                    "the model with the logits (take the softmax only for predictions)"))
                continue
            if call.qualname == "torch.log" or (call.method == "log" and not call.node.args):
                arg = call.arg(0) if call.qualname == "torch.log" else call.receiver
                if arg is not None and resolver.prob_kind(arg, call) == SOFTMAX:
                    yield Finding(call.node, (
                        f"`log` of the softmax output {_shown(model, arg)}: it underflows to -inf for confident "
                        "logits and gives NaN gradients; use `log_softmax` (F.log_softmax / torch.log_softmax)"))
                continue
            if not call.node.args:
                continue
            inline = isinstance(call.node.func, cst.Call)  # nn.CrossEntropyLoss()(probs, y)
            if not inline and (call.func_text is None or call.qualname not in LOGIT_LOSS_FUNCTIONS
                               and not candidates(call)):
                continue
            loss = _loss_kind(resolver, call)
            if loss is None:
                continue
            arg = call.arg(0, "input")
            kind = resolver.prob_kind(arg, call) if arg is not None else None
            if kind not in _WRONG_INPUT[loss]:
                continue
            shown = _shown(model, arg)
            if loss == CE and kind == SIGMOID:
                message = (f"{shown} is a sigmoid output fed to cross-entropy, which applies log_softmax itself: "
                           "values squashed into (0, 1) give the loss a floor (1.461 nats for 10 classes) and "
                           "shrink its gradients; pass the logits (or use BCELoss/BCEWithLogitsLoss for "
                           "independent labels)")
            elif loss == CE:
                message = (f"{shown} is a softmax output fed to cross-entropy, which applies log_softmax itself: "
                           "the loss has a floor and the gradients of confident mistakes shrink ~10,000x; pass the "
                           "logits (take the softmax only for metrics)")
            elif loss == KL:
                message = (f"{shown} is a softmax output fed to KLDivLoss/kl_div as its input, which expects "
                           "log-probabilities: the loss is no KL divergence (it goes negative) and the student "
                           "collapses onto the target's most likely class; use `log_softmax` for the input")
            elif loss == NLL:
                message = (f"{shown} is a {kind} output fed to NLLLoss, which expects log-probabilities; use "
                           "`log_softmax` (or pass the logits to cross_entropy)")
            else:
                message = (f"{shown} is a sigmoid output fed to a *WithLogits loss, which applies the sigmoid "
                           "itself: the gradient shrinks ~4,000x and the loss has a floor of 0.693; pass the logits")
            yield Finding(call.node, message)
