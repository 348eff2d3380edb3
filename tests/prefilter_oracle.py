"""Oracle for the prefilter's claims (:mod:`torchgradlint.prefilter`).

Stage 1's backward test (:func:`torchgradlint.prefilter.may_call_backward`)
claims: a file for which it is ``False`` has no call that the analysis
classifies as a backward. Stage 2
(:func:`torchgradlint.prefilter.lacks_grad_evidence`) claims: a file that
cannot call a backward, spells none of ``GRAD_EVIDENCE`` and runs no loop, no
``self`` and no call to a same-file function at module or class scope has no
backward call and no fact that runs with grad mode known ENABLED inside a
loop, inside a function, or on ``self``. Each rule's own premise
(:attr:`Rule.ast_prefilter`) claims the rule reports nothing where it is
``False``. This module checks these claims
against the full LibCST analysis of a file; used by ``tests/test_prefilter.py``
and by ``realcode/check_prefilter.py`` on the real-code corpus.
"""

from __future__ import annotations

from itertools import chain

from torchgradlint.analysis import build_model
from torchgradlint.analysis.model import GradMode
from torchgradlint.analysis.steps import backward_call
from torchgradlint.engine import parse_module
from torchgradlint.prefilter import AST_PREFILTERS, FileFacts
from torchgradlint.registry import all_rules


def _mentions_self(fact) -> bool:
    texts = [getattr(fact, "receiver_text", None), getattr(fact, "func_text", None)]
    texts += [t.text for t in getattr(fact, "targets", ())]
    return any(t and (t == "self" or t.startswith("self.")) for t in texts)


def backward_counterexamples(source: str, path: str = "<src>") -> list[str]:
    """Backward calls in ``source`` (the stage-1 claim is that a file with
    ``may_call_backward(source) == False`` has none). Raises
    ``libcst.ParserSyntaxError`` if LibCST cannot parse."""
    model = build_model(parse_module(source), source, path)
    return _backward_calls(model, path)


def _backward_calls(model, path: str) -> list[str]:
    return [f"{path}: backward call {c.func_text}" for c in model.calls if backward_call(model, c) is not None]


def counterexamples(source: str, path: str = "<src>") -> list[str]:
    """Facts of ``source`` that contradict stage 2's claim (empty when the
    claim holds). Raises ``libcst.ParserSyntaxError`` if LibCST cannot parse."""
    model = build_model(parse_module(source), source, path)
    bad = _backward_calls(model, path)
    for f in chain(model.calls, model.assigns):
        if model.grad_mode(f) is not GradMode.ENABLED:
            continue
        if f.scope.kind not in ("module", "class") or f.loop is not None or _mentions_self(f):
            bad.append(f"{path}: grad ENABLED at {type(f).__name__} in {f.scope.kind} {f.scope.name} "
                       f"(loop: {f.loop is not None})")
    return bad


def premise_counterexamples(source: str, path: str = "<src>") -> list[str]:
    """Findings that stage 2's per-rule premises would lose: for each rule
    whose text stage matches ``source`` but whose premise
    (:data:`torchgradlint.prefilter.AST_PREFILTERS`) is ``False``, the findings
    the rule reports on the full analysis (the claim is that there are none).
    Raises ``libcst.ParserSyntaxError`` if LibCST cannot parse."""
    facts = FileFacts(source)
    dropped = [r for r in all_rules() if r.ast_prefilter and r.may_fire(source)
               and not AST_PREFILTERS[r.ast_prefilter](facts)]
    if not dropped:
        return []
    model = build_model(parse_module(source), source, path)
    return [f"{path}: {rule.code} reports ({f.message}) but its premise {rule.ast_prefilter!r} is False"
            for rule in dropped for f in rule().check(model)]
