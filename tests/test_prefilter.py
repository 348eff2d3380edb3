"""Prefilter: stage 1 (text) and stage 2 (Python ast) never drop a finding."""

import textwrap
from pathlib import Path

import pytest

from prefilter_oracle import backward_counterexamples, counterexamples
from torchgradlint.engine import lint_source
from torchgradlint.fixture_spec import load_fixtures
from torchgradlint.prefilter import (
    AST_PREFILTERS,
    candidate_rules,
    is_other_framework_code,
    lacks_grad_evidence,
    may_call_backward,
    python_ast,
    runs_code_at_definition_time,
)
from torchgradlint.registry import all_rules, get_rule

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
TGL101 = get_rule("TGL101")


def _src(text: str) -> str:
    return textwrap.dedent(text).lstrip()


LIBRARY_MODULE = _src("""
    import torch

    class Tracker:
        def update(self, outputs, loss):
            for out in outputs:
                self.history.append(out)
            self.total += loss
    """)


@pytest.mark.parametrize("source, runs", [
    (LIBRARY_MODULE, False),
    ("import torch\nlog = get_logger(__name__)\n", False),  # a call, but not to a function defined here
    ("import torch\nfor x in xs:\n    pass\n", True),
    ("import torch\nwhile True:\n    break\n", True),
    ("import torch\nys = [f(x) for x in xs]\n", True),
    ("import torch\ndef main():\n    pass\nif __name__ == '__main__':\n    main()\n", True),
    ("import torch\ndef train():\n    pass\nclass A:\n    x = train()\n", True),  # class body runs at import
    ("import torch\ndef deco(f):\n    return f\n@deco\ndef g():\n    pass\n", False),  # bare decorator: no call
    ("import torch\ndef deco(n):\n    return n\n@deco(3)\ndef g():\n    pass\n", True),
    ("import torch\ndef f(x=helper()):\n    pass\ndef helper():\n    pass\n", True),  # default runs at def time
    ("import torch\nclass A:\n    def run(self):\n        pass\nA().run()\n", True),  # method name matched
    ("import torch\nself.losses.append(loss)\n", True),
    ("import torch\ndef outer():\n    def inner():\n        pass\ninner()\n", True),  # nested def, by name
    ("import torch\nasync def fetch():\n    pass\nfetch()\n", True),
    ("import torch\ndef \\\n  split():\n    pass\nsplit()\n", True),  # continuation after def
    ("import torch\ndef\tλ():\n    pass\nλ()\n", True),  # tab, non-ASCII name
    ("import torch\ndef a·b():\n    pass\na·b()\n", True),  # U+00B7 continues a name but is not \\w
    ("import torch\ndef ﬁt():\n    pass\nfit()\n", True),  # Python NFKC-normalises names: defines fit
    ("import torch\nDOC = 'def helper(): ...'\nhelper()\n", True),  # def in a string: kept (superset)
    ("import torch\ndef helper():\n    pass\nundefined_helper()\n", False),
])
def test_runs_code_at_definition_time(source, runs):
    tree = python_ast(source)
    assert tree is not None
    assert runs_code_at_definition_time(tree, source) is runs


def test_library_module_is_not_parsed_for_tgl101():
    assert candidate_rules(LIBRARY_MODULE, [TGL101]) == []
    result = lint_source(LIBRARY_MODULE, "lib.py", [TGL101])
    assert result.parsed is False


@pytest.mark.parametrize("extra", [
    "        loss.backward()\n",
    "        torch.autograd.grad(loss, [p])\n",
    "        self.manual_backward(loss)\n",
    "        with torch.enable_grad():\n            pass\n",
    "        torch.set_grad_enabled(True)\n",
])
def test_grad_evidence_keeps_the_file(extra):
    assert candidate_rules(LIBRARY_MODULE + extra, [TGL101]) == [TGL101]


@pytest.mark.parametrize("source, calls", [
    ("loss.backward()\n", True),
    ("(loss * 2).backward(retain_graph=True)\n", True),
    ("loss . backward ()\n", True),
    ("(loss.\n    backward())\n", True),  # a newline inside brackets
    ("(loss.  # why\n    backward())\n", True),  # and a comment
    ("loss.\\\n    backward()\n", True),  # a line continuation
    ("self.manual_backward(loss)\n", True),
    ("accelerator.backward(loss)\n", True),
    ("from torch import autograd\nautograd.grad(y, [x])\n", True),
    ("from torch.autograd import backward as bw\nbw([y])\n", True),
    ("x.backward_hook()\nregister_backward_hook(f)\n", False),
    ("# run the LSTM forward and backward\nbackward_states = lstm(x)\n", False),
    ("def backward(ctx, grad):\n    return grad\n", False),
    ("# Helpers.\n" + "#" * 80 + "\n" + "# " * 200 + "\n", False),  # a banner: answered at once, not by
    ("x = (a.\n" + "#" * 80 + "\n  backward())\n", True),           # backtracking through every split
])
def test_may_call_backward(source, calls):
    assert may_call_backward(source) is calls
    assert (backward_counterexamples(source) != []) is calls  # the analysis agrees


MXNET_TRAINING = _src("""
    from mxnet import autograd, gluon
    def train(net, loss_fn, trainer, data_iter, batch_size):
        losses = []
        for X, y in data_iter:
            with autograd.record():
                l = loss_fn(net(X), y)
            l.backward()  # MXNet overwrites gradients (grad_req="write"): no reset needed
            trainer.step(batch_size)
            losses.append(l)
        return losses
""")


@pytest.mark.parametrize("header, other", [
    ("from mxnet import autograd, gluon\n", True),
    ("import tensorflow as tf\n", True),
    ("import jax.numpy as jnp\n", True),
    ("    import paddle\n", True),  # indented (inside try/if) still counts
    ("import jaxlib\n", False),  # another package whose name starts the same
    ("# we used to import mxnet here\n", False),  # a comment, not an import
    ("from mxnet import autograd\nimport torch\n", False),  # mixed code: linted
    ("", False),
])
def test_other_framework_code(header, other):
    body = "def train(m, opt, loader):\n    for x in loader:\n        m(x).backward()\n        opt.step()\n"
    source = header + body
    assert is_other_framework_code(source) is other
    assert (candidate_rules(source, all_rules()) == []) is other


def test_other_framework_code_is_not_parsed():
    # Without the scope check the loop's backward, step and appended loss
    # make the rules candidates and the file is parsed; with it, it is not.
    unknown = MXNET_TRAINING.replace("mxnet", "framework")
    assert candidate_rules(unknown, all_rules()) != []
    assert lint_source(unknown, "train.py", all_rules()).parsed
    assert candidate_rules(MXNET_TRAINING, all_rules()) == []
    assert not lint_source(MXNET_TRAINING, "d2l_mxnet.py", all_rules()).parsed


def test_rules_that_need_a_backward_are_dropped_without_one():
    source = _src("""
        import torch
        def run(model, optimizer, loader, lstm):
            forward_states, backward_states = lstm(loader)  # no backward call here
            for x in loader:
                optimizer.step()
                with torch.no_grad():
                    y = model(x)
        """)
    # the first five rules; rules without needs_backward match on their own words (TGL103: no_grad)
    rules = [r for r in all_rules() if r.code in ("TGL001", "TGL002", "TGL101", "TGL102", "TGL201")]
    codes = [r.code for r in candidate_rules(source, rules)]
    # TGL001 needs a backward (TGL101's text stage fails); TGL002 also judges no_grad regions
    # that cut a parameter's only path, which needs no backward in the file.
    assert codes == ["TGL002", "TGL201"]
    with_backward = source.replace("optimizer.step()", "optimizer.step()\n        y.backward()")
    assert [r.code for r in candidate_rules(with_backward, rules)] == ["TGL001", "TGL002", "TGL201"]


def test_other_candidate_rules_keep_the_file():
    source = LIBRARY_MODULE + "        with torch.no_grad():\n            pass\n"
    assert get_rule("TGL201") in candidate_rules(source, all_rules())


def test_a_file_parsed_anyway_keeps_its_rules_without_building_the_ast(monkeypatch):
    # TGL002/TGL103 (no premise) keep a file with a no_grad region: it is parsed whatever the
    # premises say, so the ast stage is skipped (building Python's ast would cost more than the
    # rule checks it could save) and TGL101 stays a candidate
    import torchgradlint.prefilter as prefilter

    source = LIBRARY_MODULE + "        with torch.no_grad():\n            pass\n"

    def no_ast(_source):
        raise AssertionError("the ast stage ran")

    monkeypatch.setattr(prefilter, "python_ast", no_ast)
    codes = [r.code for r in candidate_rules(source, all_rules())]
    assert {"TGL002", "TGL103", "TGL101"} <= set(codes)
    # with only premise-bearing rules left, the same library module is dropped whole
    monkeypatch.undo()
    assert candidate_rules(LIBRARY_MODULE, [TGL101]) == []


def test_python_syntax_error_still_reaches_libcst_and_is_reported():
    source = "import torch\nlosses.append(loss\n"
    assert python_ast(source) is None
    diags = lint_source(source, "bad.py", [TGL101]).diagnostics
    assert [d.code for d in diags] == ["TGL000"]


def test_flake8_tree_is_used_instead_of_a_second_parse():
    import ast

    # a tree that says "stores in a data loop at module scope"
    tree = ast.parse("import torch\nfor x in loader:\n    out.append(x)\n")
    assert candidate_rules(LIBRARY_MODULE, [TGL101], tree) == [TGL101]


def test_both_stages_keep_every_fixture_finding():
    checked = 0
    for fixture in load_fixtures(FIXTURES):
        text = fixture.path.read_text()
        for code, _ in fixture.expected:
            rule = get_rule(code)
            assert candidate_rules(text, [rule]) == [rule], f"{code} prefilter drops {fixture.name}"
            checked += 1
    assert checked >= 20


def _corpus() -> list[Path]:
    """Python files of this repository: fixtures, sources, tests, scripts."""
    files = sorted(FIXTURES.rglob("*.py"))
    for sub in ("src", "tests", "scripts", "bench", "realcode"):
        files += sorted((ROOT / sub).rglob("*.py"))
    return files


def test_stage2_claim_holds_on_every_file_of_the_repository():
    """Stage 2's claim, checked against the full analysis of every file it
    would keep away from LibCST (and every fixture with the TGL101 store
    moved into a function of a library module)."""
    rejected = 0
    bad: list[str] = []
    for path in _corpus():
        text = path.read_text()
        if lacks_grad_evidence(text):
            rejected += 1
            bad += counterexamples(text, str(path.relative_to(ROOT)))
    assert bad == []
    assert rejected >= 20  # the claim was exercised on real files


def test_backward_claim_holds_on_every_file_of_the_repository():
    """Stage 1's backward test, checked against the analysis of every file
    of the repository that it says cannot call a backward."""
    without = 0
    bad: list[str] = []
    for path in _corpus():
        text = path.read_text()
        if not may_call_backward(text):
            without += 1
            bad += backward_counterexamples(text, str(path.relative_to(ROOT)))
    assert bad == []
    assert without >= 20


EVALUATE_HELPER = _src("""
    import torch
    def evaluate(model, loader):
        outs = []
        for x in loader:
            outs.append(model(x))
        return outs
    """)


@pytest.mark.parametrize("source", [
    LIBRARY_MODULE,
    EVALUATE_HELPER,
    _src("""
        import torch
        class Loop:
            def run(self, model, loader):
                for x in loader:
                    self.outputs.append(model(x))
            def helper(self):
                return self.run(self.model, self.loader)
        """),
])
def test_stage2_claim_on_library_shapes(source):
    assert lacks_grad_evidence(source)
    assert counterexamples(source) == []


@pytest.mark.parametrize("source", [
    EVALUATE_HELPER + "outs = evaluate(net, data)\n",  # the helper now runs at import time
    _src("""
        import torch
        for x in loader:
            outs.append(model(x))
        """),
])
def test_definition_time_code_makes_grad_mode_known(source):
    # the analysis does see grad mode ENABLED here, and stage 2 keeps the file
    assert counterexamples(source) != []
    assert not lacks_grad_evidence(source)


# -- rule-specific ast stage (Rule.ast_prefilter) -----------------------------------------------
from torchgradlint.prefilter import (  # noqa: E402
    FileFacts,
    may_build_layer_in_forward,
    may_call_functional_dropout,
    may_evaluate_trained_module,
    may_feed_probabilities_to_loss,
    may_hold_unregistered_attribute,
    may_switch_to_eval,
    may_use_grad_scaler,
)


def _tree(src: str) -> FileFacts:
    import textwrap

    return FileFacts(textwrap.dedent(src))


def test_unregistered_attribute_premise():
    assert may_hold_unregistered_attribute(_tree("""
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.heads = [nn.Linear(4, 4) for _ in range(3)]
        """))
    assert may_hold_unregistered_attribute(_tree("""
        class Net(nn.Module):
            def __init__(this, n):
                layers = []
                for _ in range(n):
                    layers.append(nn.Linear(4, 4))
                this.layers = layers
        """))
    assert may_hold_unregistered_attribute(_tree("""
        class Net(nn.Module):
            def __init__(self):
                self.w = torch.randn(3, requires_grad=True)
        """))
    assert may_hold_unregistered_attribute(_tree("""
        class Net(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.heads = [nn.Linear(4, 2).cuda() for _ in range(n)]
        """))  # DomainBed's TRM: a layer moved to the GPU is still a layer
    assert not may_hold_unregistered_attribute(_tree("""
        class Net(nn.Module):
            def __init__(self, xs):
                super().__init__()
                self.xs = [x.float().cuda() for x in xs]
        """))
    # plain attributes and registered containers: TGL006 cannot fire
    assert not may_hold_unregistered_attribute(_tree("""
        class Net(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.dim = dim
                self.fc = nn.Linear(dim, dim)
                self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(2))
        """))


def test_layer_built_in_forward_premise():
    assert may_build_layer_in_forward(_tree("""
        class Net(nn.Module):
            def forward(self, x):
                return self.project(x)
            def project(self, x):
                return nn.Linear(x.shape[-1], 8)(x)
        """))
    assert may_build_layer_in_forward(_tree("""
        from torch.nn import Linear as Dense
        class Net(nn.Module):
            def forward(self, x):
                return Dense(4, 4)(x)
        """))
    # layers built only in __init__ or in helpers that only __init__ calls
    assert not may_build_layer_in_forward(_tree("""
        class ResNet(nn.Module):
            def __init__(self):
                super().__init__()
                self.layer1 = self._make_layer(64)
            def _make_layer(self, planes):
                return nn.Sequential(nn.Conv2d(planes, planes, 3), nn.BatchNorm2d(planes))
            def forward(self, x):
                return self.layer1(x)
        """))


def test_ast_stage_keeps_every_file_a_rule_reports_on(tmp_path):
    # the rule's own findings on its fixtures survive the ast stage
    from pathlib import Path

    from torchgradlint.prefilter import candidate_rules
    from torchgradlint.registry import all_rules

    rules = [r for r in all_rules() if r.ast_prefilter]
    assert {r.code for r in rules} == {"TGL005", "TGL006", "TGL007", "TGL101", "TGL201", "TGL202", "TGL203", "TGL302",
                                       "TGL303"}
    root = Path(__file__).resolve().parents[1] / "fixtures"
    for rule in rules:
        for bad in sorted((root / rule.code).glob("bad_*.py")):
            assert rule in candidate_rules(bad.read_text(), [rule]), bad.name


def test_unregistered_attribute_premise_needs_an_item_that_can_be_a_layer():
    # containers of literals, attributes or subscripts, never filled in __init__: nothing to register
    assert not may_hold_unregistered_attribute(_tree("""
        class Tracker(nn.Module):
            def __init__(self, names):
                super().__init__()
                self.cache = {}
                self.names = [a.name for a in names]
                self.sizes = [0, 1, 2]
        """))
    # the same empty list filled by an append later in __init__ can hold layers
    assert may_hold_unregistered_attribute(_tree("""
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.blocks = []
                self.blocks.append(nn.Linear(4, 4))
        """))
    # a class without a base class is not a torch module
    assert not may_hold_unregistered_attribute(_tree("""
        class Plain:
            def __init__(self):
                self.layers = [nn.Linear(4, 4)]
        """))


def test_evaluates_trained_module_premise_ignores_the_word_backward():
    assert not may_evaluate_trained_module(_tree("""
        # kept for backward compatibility
        def predict(model, x):
            return model(x)
        """))
    assert may_evaluate_trained_module(_tree("with torch.no_grad():\n    y = model(x)\n"))
    # training (a backward call, or a helper's .train()) and a loop that may walk data
    assert may_evaluate_trained_module(_tree("loss.backward()\nfor x in val_loader:\n    out = model(x)\n"))
    assert may_evaluate_trained_module(_tree("model.train()\nfor x, y in pairs:\n    out = model(x)\n"))
    # training without a data loop, or a data loop without training: no finding possible
    assert not may_evaluate_trained_module(_tree("loss.backward()\nfor i in range(3):\n    print(i)\n"))
    assert not may_evaluate_trained_module(_tree("for x in test_loader:\n    out = model(x)\n"))


def test_functional_dropout_premise_follows_import_aliases():
    assert may_call_functional_dropout(_tree("y = F.dropout(x, 0.5)\n"))
    assert may_call_functional_dropout(_tree(
        "from torch.nn.functional import scaled_dot_product_attention as sdpa\ny = sdpa(q, k, v, dropout_p=0.1)\n"))
    # a Dropout module and a ``dropout`` argument are not functional dropout calls
    assert not may_call_functional_dropout(_tree("self.drop = nn.Dropout(dropout)\nlayer = Block(dropout=0.1)\n"))


_DROPOUT_METHOD = "import torch\nimport torch.nn.functional as F\nfrom torch import nn\n{head}\n\n" \
    "class Net(nn.Module):\n    def forward(self, x, q, k, v):\n        return {call}\n"


@pytest.mark.parametrize("head, call, kept", [
    ("", "F.dropout(x, 0.5)", True),
    ("", "torch.dropout(x, 0.5, True)", True),
    ("from torch.nn.functional import dropout", "dropout(x, 0.5)", True),
    ("from torch.nn.functional import dropout as drop", "drop(x, 0.5)", True),
    ("drop = F.dropout", "drop(x, 0.5)", True),  # a module-level alias the builder resolves
    ("if True:\n    drop = torch.nn.functional.dropout", "drop(x, 0.5)", True),
    ("drop = F.dropout\ndrop = make_drop", "drop(x, 0.5)", True),  # a non-torch value leaves the alias
    ("drop = make_drop\ndrop = F.dropout", "drop(x, 0.5)", True),
    ("drop = F.dropout\nd2 = drop", "d2(x, 0.5)", True),  # an alias of an alias
    ("from torch.nn.functional import dropout as dr\nd2 = dr", "d2(x, 0.5)", True),
    ("drop, y = F.dropout, 1", "drop(x, 0.5)", True),  # a parallel assignment
    ("", "F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)", True),
    ("", "F.scaled_dot_product_attention(q, k, v, None, 0.1)", True),
    # a dropout module's call, SDPA without a dropout probability, star arguments: the rule never fires
    ("", "self.dropout(x)", False),
    ("", "self.attn.dropout(x, 0.5)", False),
    ("", "F.scaled_dot_product_attention(q, k, v, is_causal=True)", False),
    ("", "F.dropout(*x)", False),
    ("", "F.scaled_dot_product_attention(q, k, v, **kw)", False),
    ("def dropout(x, p):\n    return x", "dropout(x, 0.5)", False),  # a local function, not torch's
    # tied to the module's mode: a training argument, a probability that reads ``training``
    ("", "F.dropout(x, 0.5, training=self.training)", False),
    ("", "F.dropout(x, self.p, self.training)", False),
    ("", "F.dropout(x, p=0.5 if self.training else 0.0)", False),
    ("", "F.dropout(x, p=self.cfg.training_p)", False),
    ("", "F.dropout(x, p=get(x).training)", True),  # not a dotted name: the rule does not read it
    ("", "torch.dropout(x, 0.5, self.training)", False),
    ("", "torch.dropout(x, 0.5, train=True)", True),
    ("", "F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0)", False),
    ("", "F.scaled_dot_product_attention(q, k, v, None, self.p if self.training else 0.0)", False),
])
def test_functional_dropout_premise_matches_the_rule(head, call, kept):
    """The premise keeps exactly the files where TGL203 can fire here: it must
    never drop one the rule reports (asserted against the rule itself)."""
    src = _DROPOUT_METHOD.format(head=head, call=call)
    assert may_call_functional_dropout(FileFacts(src)) is kept
    assert _reports(src, "TGL203") == kept  # a finding the premise would have thrown away is a missed finding


def _reports(src: str, code: str) -> bool:
    """Whether rule ``code`` reports on ``src`` in the full analysis, with no
    prefilter in the way (``lint_source`` would apply the premise under test)."""
    from torchgradlint.analysis import build_model
    from torchgradlint.engine import parse_module

    return bool(list(get_rule(code)().check(build_model(parse_module(src), src, "m.py"))))


def test_probabilities_into_loss_premise_needs_both_calls():
    assert may_feed_probabilities_to_loss(_tree("loss = F.cross_entropy(F.softmax(z, 1), y)\n"))
    assert may_feed_probabilities_to_loss(_tree("p = z.softmax(-1)\nlp = torch.log(p)\n"))
    assert may_feed_probabilities_to_loss(_tree("crit = nn.BCEWithLogitsLoss()\nact = nn.Sigmoid()\n"))
    assert not may_feed_probabilities_to_loss(_tree("p = F.softmax(z, 1)\nacc = (p.argmax(1) == y).float()\n"))
    assert not may_feed_probabilities_to_loss(_tree("loss = F.cross_entropy(z, y)  # softmax inside\n"))


def test_grad_scaler_premise():
    assert may_use_grad_scaler(_tree("from torch.amp import GradScaler as GS\ns = GS()\n"))
    assert may_use_grad_scaler(_tree("self.grad_scaler.scale(loss).backward()\n"))
    assert may_use_grad_scaler(_tree("amp_scaler.step(opt)\n"))
    # "scale" and "step" in other meanings
    assert not may_use_grad_scaler(_tree("x = x * scale\nsched.step()\nopt.step()\n"))


def test_switches_to_eval_premise():
    assert may_switch_to_eval(_tree("model.eval()\n"))
    assert may_switch_to_eval(_tree("model.train(False)\n"))
    assert may_switch_to_eval(_tree("model.train(mode=False)\n"))
    # evaluation as a word, literal_eval, an evaluator object, model.train()
    assert not may_switch_to_eval(_tree(
        "r = ast.literal_eval(s)\nevaluator.run(loader)\nmodel.train()\neval_every = 10\n"))


@pytest.mark.parametrize("name", sorted(__import__("torchgradlint.prefilter", fromlist=["x"]).AST_PREFILTERS))
def test_every_premise_keeps_a_file_python_cannot_parse(name):
    from torchgradlint.prefilter import AST_PREFILTERS

    assert AST_PREFILTERS[name](FileFacts("def f(:\n    loss.backward()  # no_grad\n"))


def test_premises_drop_no_finding_on_the_projects_own_programs():
    # Soundness on every fixture and harness program: where a rule's premise says it
    # cannot fire, the full analysis finds nothing for it (realcode/check_prefilter.py
    # asks the same of the real-code corpus).
    from pathlib import Path

    from prefilter_oracle import premise_counterexamples
    from torchgradlint.prefilter import AST_PREFILTERS
    from torchgradlint.registry import all_rules

    root = Path(__file__).resolve().parents[1]
    rules = [r for r in all_rules() if r.ast_prefilter]
    bad: list[str] = []
    dropped_somewhere: set[str] = set()
    for path in [*root.glob("fixtures/**/*.py"), *root.glob("tests/harness_programs/**/*.py")]:
        src = path.read_text(encoding="utf-8")
        facts = FileFacts(src)
        dropped_somewhere |= {r.code for r in rules if r.may_fire(src) and not AST_PREFILTERS[r.ast_prefilter](facts)}
        bad += premise_counterexamples(src, path.name)
    assert bad == []
    assert len(dropped_somewhere) >= 4, dropped_somewhere  # the premises do drop rules on these files


def test_stores_with_grad_enabled_premise_follows_definition_time_calls():
    from torchgradlint.prefilter import may_store_with_grad_enabled

    # a library module: functions only, nothing runs them at definition time
    assert not may_store_with_grad_enabled(_tree("""
        import torch
        def collect(model, xs):
            outs = []
            for x in xs:
                outs.append(model(x))
            return outs
        """))
    # the same function, over a data loader, called (through a helper) from the script's main block
    called = """
        import torch
        def collect(model, loader):
            outs = []
            for x in loader:
                outs.append(model(x))
            return outs
        def main():
            collect(net, data)
        if __name__ == "__main__":
            main()
        """
    assert may_store_with_grad_enabled(_tree(called))
    # without a backward no loop trains: a store that is not into self needs a loop that
    # may walk a data source (``iterates_data``), e.g. not a loop over graph nodes or layers
    assert not may_store_with_grad_enabled(_tree(called.replace("loader", "nodes")))
    assert not may_store_with_grad_enabled(_tree("env = {}\nfor n in graph.nodes:\n    env[n.name] = f(n)\n"))
    assert not may_store_with_grad_enabled(_tree("while k < 9:\n    outs.append(net(x))\n"))
    # ... at any depth of such a loop, through a wrapper, or with a tuple target
    assert may_store_with_grad_enabled(_tree("while True:\n    for b in tqdm(loader):\n        if b:\n"
                                             "            outs.append(net(b))\n"))
    assert may_store_with_grad_enabled(_tree("for x, y in pairs:\n    total += crit(net(x), y)\n"))
    # a store into self outlives the call, loop or not
    assert may_store_with_grad_enabled(_tree("""
        class Tracker:
            def update(self, loss):
                self.total += loss
        t = Tracker()
        t.update(l)
        """))
    # a top-level loop that stores, and a top-level loop that does not
    assert may_store_with_grad_enabled(_tree("hist = []\nfor b in loader:\n    hist.append(net(b))\n"))
    assert not may_store_with_grad_enabled(_tree("for name in names:\n    print(name)\n"))
    # with a backward (or a grad-mode API) spelled, a lasting store anywhere keeps the file ...
    assert may_store_with_grad_enabled(_tree(
        "def f(model, xs):\n    for x in xs:\n        l = model(x)\n        l.backward()\n        h.append(l)\n"))
    # ... and without any lasting store the rule has nothing to report
    assert not may_store_with_grad_enabled(_tree("def f(l):\n    l.backward()\n    return [l.item()]\n"))


_LAYERS_IN_A_LIST = "\n    def __init__(self):\n        super().__init__()\n" \
    "        self.heads = [nn.Linear(4, 4) for _ in range(2)]\n"


@pytest.mark.parametrize("head, kept", [
    ("import torch\nfrom torch import nn\nclass Net(nn.Module):", True),
    ("import torch\nfrom torch import nn\nclass Net(torch.nn.Module):", True),
    ("import torch.nn as tnn\nfrom torch import nn\nclass Net(tnn.Module):", True),
    ("from torch.nn import Module as M\nfrom torch import nn\nclass Net(M):", True),
    ("from torch.nn import Sequential\nfrom torch import nn\nclass Net(Sequential):", True),
    # a module-level alias of a torch class: the builder resolves it
    ("import torch\nfrom torch import nn\nM = nn.Module\nclass Net(M):", True),
    ("import torch\nfrom torch import nn\nif True:\n    M = torch.nn.Module\nclass Net(M):", True),
    ("from torch import nn\nclass Base(nn.Module):\n    pass\nclass Net(Base):", True),
    ("from torch import nn\nM, k = nn.Module, 1\nclass Net(M):", True),
    ("import pytorch_lightning as pl\nfrom torch import nn\nclass Net(pl.LightningModule):", True),
    # a dataset, a plain object: not torch module classes, whatever they store
    ("from torch.utils.data import Dataset\nfrom torch import nn\nclass Net(Dataset):", False),
    ("import torch.utils.data as tud\nfrom torch import nn\nclass Net(tud.Dataset):", False),
    ("from torch import nn\nclass Net(object):", False),
    ("from torch import nn\nD = make_base()\nclass Net(D):", False),
])
def test_unregistered_attribute_premise_matches_the_rule(head, kept):
    src = head + _LAYERS_IN_A_LIST
    assert may_hold_unregistered_attribute(FileFacts(src)) is kept
    assert _reports(src, "TGL006") == kept


@pytest.mark.parametrize("code, src", [
    ("TGL303", "import torch\nimport torch.nn.functional as F\n{alias}\nfor x, y in loader:\n"
               "    loss = F.cross_entropy(a(net(x), 1), y)\n    loss.backward()\n"),
    ("TGL007", "import torch\nfrom torch import nn\n{alias}\nclass Net(nn.Module):\n"
               "    def forward(self, x):\n        return a(4, 4)(x)\n"),
])
@pytest.mark.parametrize("alias", ["a = {v}", "b = {v}\na = b", "a, k = {v}, 1", "if True:\n    a = {v}"])
def test_premises_follow_module_level_aliases(code, src, alias):
    """The builder turns a module-level ``a = <torch name>`` (through earlier
    aliases, in a parallel assignment, in an ``if``) into an alias: every
    premise that reads called names sees the aliased name too."""
    value = "F.softmax" if code == "TGL303" else "nn.Linear"
    text = src.format(alias=alias.format(v=value))
    rule = get_rule(code)
    assert AST_PREFILTERS[rule.ast_prefilter](FileFacts(text))
    assert _reports(text, code)


_GRAD_SWITCH_IN_LOOP = "import torch\nimport torch.nn.functional as F\n{head}\n" \
    "for x, y in loader:\n    {switch}\n    loss = F.mse_loss(net(x), y)\n    loss.backward()\n    opt.step()\n"


@pytest.mark.parametrize("head, switch, kept", [
    ("", "torch.set_grad_enabled(False)", True),
    ("from torch import set_grad_enabled as sge", "sge(False)", True),
    # (a module-level alias: the premise keeps the file; the builder resolves such aliases after its
    # walk, so the rule does not see this statement switch; a superset is what the premise must be)
    ("sge = torch.set_grad_enabled", "sge(False)", None),
    ("", "torch.no_grad().__enter__()", True),
    ("from torch import no_grad", "no_grad().__enter__()", True),
    ("ng, k = torch.no_grad, 1", "ng().__enter__()", True),
    # a with statement, a context manager class's own __enter__, another context's __enter__
    ("", "with torch.set_grad_enabled(False):\n        pass", False),
    ("class Ctx:\n    def __enter__(self):\n        return self", "Ctx().__exit__(None, None, None)", False),
    ("", "torch.enable_grad().__enter__()", False),
    ("", "mode = torch.set_grad_enabled(False)", False),
])
def test_grad_switch_statement_premise_matches_the_rule(head, switch, kept):
    src = _GRAD_SWITCH_IN_LOOP.format(head=head, switch=switch)
    assert AST_PREFILTERS["grad-switch-statement"](FileFacts(src)) is (kept is not False)
    assert _reports(src, "TGL005") == bool(kept)


def test_unregistered_attribute_premise_needs_a_class_that_may_be_a_torch_module():
    # a dataset or a helper object: not a torch module class, whatever it stores
    assert not may_hold_unregistered_attribute(_tree("""
        class Pairs(Dataset):
            def __init__(self, files):
                self.transforms = [ToTensor(), Normalize(0.5, 0.5)]
        """))
    # through an import alias, a same-file base, or a forward it defines
    for head in ("from torch.nn import Module as M\nclass Net(M):",
                 "class Base(Something):\n    pass\nclass Net(Base):",
                 "class Net(Registrable):\n    def forward(self, x):\n        return x"):
        assert may_hold_unregistered_attribute(_tree(head + """
    def __init__(self):
        self.heads = [Linear(4, 4) for _ in range(2)]
"""))
