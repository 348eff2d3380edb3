"""Engine: prefilter, noqa, sorting, positions, selection."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchgradlint.engine import lint_source
from torchgradlint.fixture_spec import load_fixtures
from torchgradlint.noqa import NoqaFilter, is_suppressed
from torchgradlint.registry import RuleLayer, SelectionError, all_rules, get_rule, resolve_codes

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
BAD_LOOP = (FIXTURES / "TGL001" / "bad_basic_loop.py").read_text()


def test_prefilter_never_drops_a_finding_on_any_fixture():
    for fixture in load_fixtures(FIXTURES):
        text = fixture.path.read_text()
        for code, _ in fixture.expected:
            assert get_rule(code).may_fire(text), f"{code} prefilter drops {fixture.name}"


def test_file_without_torch_hints_is_not_parsed():
    result = lint_source("def f(:\n", "x.py", all_rules())  # would be a syntax error if parsed
    assert result.diagnostics == [] and result.parsed is False


def test_syntax_errors_are_left_to_other_tools_when_no_rule_can_fire():
    # nothing here can hold a finding of any rule, so the file is not parsed at all
    result = lint_source("import torch\ndef f(:\n", "x.py", all_rules())
    assert result.diagnostics == [] and result.parsed is False


def test_rule_prefilter_skips_parsing():
    result = lint_source("import torch\nx = torch.ones(3)\n", "x.py", [get_rule("TGL001")])
    assert result.parsed is False


@pytest.mark.parametrize("comment, silenced", [
    ("# noqa", True),
    ("# noqa: TGL001", True),
    ("# NOQA:TGL001", True),
    ("# noqa: TGL0", True),
    ("# noqa: TGL101", False),
    ("# noqa: E501,TGL001", True),
    ("# noqa: E501", False),
    ("# not a noqa", False),
])
def test_noqa_forms(comment, silenced):
    src = BAD_LOOP.replace("# expect: TGL001", comment)
    diags = lint_source(src, "x.py", all_rules()).diagnostics
    assert (not any(d.code == "TGL001" for d in diags)) is silenced


def test_noqa_mapping_covers_multiline_strings():
    src = 'x = """\nfoo\n"""  # noqa: TGL001\n'
    f = NoqaFilter(src)
    assert f.suppressed("TGL001", 1) and f.suppressed("TGL001", 3)
    assert not f.suppressed("TGL101", 1)
    assert is_suppressed("TGL001", "x  # noqa:TGL001,TGL002")


def test_diagnostic_positions_are_one_based_and_span_the_node():
    d, = lint_source(BAD_LOOP, "x.py", all_rules()).diagnostics
    assert (d.line, d.col) == (16, 9)
    assert (d.end_line, d.end_col) == (16, 9 + len("optimizer.step()"))


def test_selection_by_code_prefix_name_and_all():
    def codes(select=None, ignore=(), extend_select=()):
        return set(resolve_codes([RuleLayer(select, tuple(extend_select), tuple(ignore))]))

    assert codes(("TGL001",)) == {"TGL001"}
    assert codes(("missing-zero-grad",)) == {"TGL001"}
    assert codes(("ALL",)) == {r.code for r in all_rules()}
    assert codes(("TGL1",)) == {r.code for r in all_rules() if r.code.startswith("TGL1")} >= {"TGL101", "TGL102"}
    assert codes() == {r.code for r in all_rules() if r.default_enabled}
    assert "TGL001" not in codes(None, ignore=["TGL0"])
    assert codes((), extend_select=["TGL001"]) == {"TGL001"}
    tgl0 = {r.code for r in all_rules() if r.code.startswith("TGL0")}
    assert codes(("TGL0",), ignore=["backward-under-no-grad"], extend_select=["TGL201"]) == (
        tgl0 - {"TGL002"}) | {"TGL201"}
    with pytest.raises(SelectionError, match="TGL999"):
        codes(("TGL999",))
    with pytest.raises(SelectionError, match="no-such-rule"):
        codes(ignore=["no-such-rule"])


def test_syntax_error_is_reported_not_raised():
    src = textwrap.dedent("""\
        import torch
        for x in range(3)
            loss.backward()
            opt.step()
    """)
    d, = lint_source(src, "x.py", all_rules()).diagnostics
    assert d.code == "TGL000" and d.line == 2


@pytest.mark.parametrize("source", [BAD_LOOP, "import torch\nloss.backward(\n"])  # a finding; a syntax error
def test_cyclic_gc_is_restored_after_linting(source):
    import gc

    assert gc.isenabled()
    lint_source(source, "x.py", all_rules())
    assert gc.isenabled()
    gc.disable()
    try:
        lint_source(source, "x.py", all_rules())
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()


def test_notebook_module_does_not_import_the_engine():
    probe = "import sys, torchgradlint.notebook; print('torchgradlint.engine' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_parse_patches_are_invisible_to_other_threads():
    """While threads lint, other threads building LibCST nodes by hand still
    get LibCST's validation (an invalid node raises), and afterwards LibCST's
    own ``__post_init__`` and the collector's state are back."""
    import gc
    import threading

    import libcst as cst

    from torchgradlint import engine

    original = cst.CSTNode.__dict__["__post_init__"]
    source = (FIXTURES / "TGL001" / "bad_basic_loop.py").read_text()
    rules = [r for r in all_rules() if r.default_enabled]
    stop = threading.Event()
    errors, linted, validated = [], [], []

    def linter():
        while not stop.is_set():
            linted.append(len(engine.lint_source(source, "x.py", rules).diagnostics))

    def builder():
        while not stop.is_set():
            try:
                cst.Name("not a name")  # invalid: LibCST's validation must reject it
            except cst.CSTValidationError:
                validated.append(True)
            except Exception as exc:  # e.g. the hook swapped back under this thread's feet
                errors.append(repr(exc))
            else:
                errors.append("an invalid node was accepted while another thread parsed")

    threads = [threading.Thread(target=linter) for _ in range(2)] + [threading.Thread(target=builder)]
    for t in threads:
        t.start()
    import time

    time.sleep(2.0)
    stop.set()
    for t in threads:
        t.join()
    assert not errors
    assert len(validated) > 100 and linted and set(linted) == {1}
    assert cst.CSTNode.__dict__["__post_init__"] is original
    assert gc.isenabled()


def test_gc_pause_restores_a_disabled_collector():
    import gc

    from torchgradlint import engine

    gc.disable()
    try:
        with engine._cyclic_gc_paused():
            with engine._cyclic_gc_paused():
                assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
    with engine._cyclic_gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_positions_stop_early_but_agree_with_libcst():
    """The position pass stops after the last wanted node, and the fast path
    generates only the statements around them: every wanted range must
    equal what LibCST's MetadataWrapper computes over the whole tree, and the
    fast path must answer (not fall back) for every node the analysis walk
    reaches."""
    import random

    from libcst.metadata import MetadataWrapper, PositionProvider

    from torchgradlint import engine, positions
    from torchgradlint.analysis.tree import walk

    rng = random.Random(0)
    for path in sorted(FIXTURES.glob("TGL*/*.py"))[:12]:
        source = path.read_text()
        module = engine.parse_module(source)
        full = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        nodes = list(full)
        code_nodes = [n for n in walk(module) if n is not module]
        for _ in range(5):
            wanted = set(rng.sample(nodes, min(len(nodes), rng.randint(1, 3))))
            got = positions.node_ranges(module, wanted)
            assert {n: got[n] for n in wanted} == {n: full[n] for n in wanted}, path
            got = positions.node_ranges(module, wanted, source)  # whitespace nodes: falls back
            assert {n: got[n] for n in wanted} == {n: full[n] for n in wanted}, path
            wanted = set(rng.sample(code_nodes, min(len(code_nodes), rng.randint(1, 3))))
            got = positions._statement_ranges(module, wanted, source, None)
            assert {n: got[n] for n in wanted} == {n: full[n] for n in wanted}, path


STATEMENT_SHAPES = """\
import torch  # header comment


@torch.no_grad()
@staticmethod
def evaluate(model, xs):
    # leading comment
    for x in xs:
        if x: a = model(x); b = a + 1
        elif x is None:
            pass
        else:
            with torch.enable_grad():
                c = model(
                    x,
                )
    try:
        d = 1
    except ValueError:
        d = 2
    while True: break


class Net(torch.nn.Module):
\tdef forward(self, x):
\t\treturn x
async def f():
    async for y in g():
        async with h() as z:
            await z
x = [1,
     2]; y = 3"""


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
@pytest.mark.parametrize("final_newline", [True, False])
def test_statement_positions_in_every_block_shape(newline, final_newline):
    """Each node of a file with decorators, ``;`` lines, one-line suites,
    ``elif``/``else``/``except`` branches, tab indentation, async blocks,
    every line ending and no final line break gets LibCST's own range from
    the fast path, without falling back."""
    from libcst.metadata import MetadataWrapper, PositionProvider

    from torchgradlint import engine, positions
    from torchgradlint.analysis.tree import walk

    source = STATEMENT_SHAPES.replace("\n", newline) + (newline if final_newline else "")
    module = engine.parse_module(source)
    full = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    for node in walk(module):
        if node is not module:
            assert positions._statement_ranges(module, {node}, source, None) == {node: full[node]}, node


def test_positions_fall_back_when_the_fast_path_cannot_answer(monkeypatch):
    """A statement whose text starts one line only is placed there; one whose
    text repeats is placed by Python's ``ast``. A wanted node outside every
    statement (the module), or an ``ast`` that does not match the source
    (the text check fails), takes the whole-module pass: LibCST's own
    ranges, never shifted ones."""
    import ast

    from libcst.metadata import MetadataWrapper, PositionProvider

    from torchgradlint import engine, positions

    calls = []
    whole = positions.module_ranges
    monkeypatch.setattr(positions, "module_ranges", lambda m, w: calls.append(w) or whole(m, w))
    source = "import torch\n\n\ndef f(x):\n    return x + 1\n\n\ndef g(x):\n    return x + 1\n    y = 2\n"
    module = engine.parse_module(source)
    full = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    ret_f = module.body[1].body.body[0]  # its text is also g's first line
    y = module.body[2].body.body[1]  # unique text
    shifted = ast.parse("\n" + source)  # every statement one line too low
    assert positions.node_ranges(module, {ret_f, y}, source) == {ret_f: full[ret_f], y: full[y]}
    assert positions.node_ranges(module, {y}, source, shifted) == {y: full[y]}  # the ast is not asked
    assert calls == []
    assert positions.node_ranges(module, {ret_f}, source, shifted)[ret_f] == full[ret_f]
    assert len(calls) == 1
    assert positions.node_ranges(module, {module}, source)[module] == full[module]
    assert len(calls) == 2


IPYTHON_SCRIPT = """\
import torch
%matplotlib inline
!pip install -q torchvision
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
losses = []
for x, y in loader:
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    losses.append(loss)
"""


def test_a_script_exported_from_a_notebook_is_linted_past_its_ipython_lines(tmp_path):
    # Coderx7's tutorials: ``.py`` files that keep ``%matplotlib inline`` and shell escapes
    from torchgradlint.fixes import apply_edits
    from torchgradlint.registry import all_rules

    result = lint_source(IPYTHON_SCRIPT, "x.py", all_rules())
    assert [(d.code, d.line) for d in result.diagnostics] == [("TGL101", 12)]
    fixed = apply_edits(IPYTHON_SCRIPT, [d for d in result.diagnostics if d.fix]).source
    assert "%matplotlib inline\n!pip install -q torchvision\n" in fixed and "losses.append(loss.item())" in fixed
    # a real syntax error past the IPython lines is reported where it is
    broken = lint_source(IPYTHON_SCRIPT.replace("losses = []", "losses = ["), "x.py", all_rules())
    assert [(d.code, d.line) for d in broken.diagnostics] == [("TGL000", 6)]
