"""Engine: prefilter, noqa, sorting, positions, selection."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchgradlint.engine import lint_source
from torchgradlint.fixture_spec import load_fixtures
from torchgradlint.noqa import NoqaFilter, is_suppressed
from torchgradlint.registry import SelectionError, all_rules, get_rule, select_rules

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
    codes = lambda rules: {r.code for r in rules}
    assert codes(select_rules(["TGL001"])) == {"TGL001"}
    assert codes(select_rules(["missing-zero-grad"])) == {"TGL001"}
    assert codes(select_rules(["ALL"])) == {r.code for r in all_rules()}
    assert "TGL001" not in codes(select_rules(None, ignore=["TGL0"]))
    assert codes(select_rules([], extend_select=["TGL001"])) == {"TGL001"}
    with pytest.raises(SelectionError):
        select_rules(["TGL999"])


def test_syntax_error_is_reported_not_raised():
    src = textwrap.dedent("""\
        import torch
        for x in range(3)
            loss.backward()
            opt.step()
    """)
    d, = lint_source(src, "x.py", all_rules()).diagnostics
    assert d.code == "TGL000" and d.line == 2


def test_rule_codes_index_lists_every_discovered_rule():
    from torchgradlint.rules import RULE_CODES

    assert RULE_CODES == tuple(r.code for r in all_rules())


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
    """The position pass stops after the last wanted node: every wanted range
    must equal what LibCST's MetadataWrapper computes over the whole tree."""
    import random

    from libcst.metadata import MetadataWrapper, PositionProvider

    from torchgradlint import engine

    rng = random.Random(0)
    for path in sorted(FIXTURES.glob("TGL*/*.py"))[:12]:
        module = engine.parse_module(path.read_text())
        full = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        nodes = list(full)
        for _ in range(5):
            wanted = set(rng.sample(nodes, min(len(nodes), rng.randint(1, 3))))
            got = engine._positions(module, wanted)
            assert {n: got[n] for n in wanted} == {n: full[n] for n in wanted}, path
