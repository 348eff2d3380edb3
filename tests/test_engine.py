"""Engine: prefilter, noqa, sorting, positions, selection."""

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
    assert codes(("TGL1",)) == {"TGL101", "TGL102"}
    assert codes() == {r.code for r in all_rules() if r.default_enabled}
    assert "TGL001" not in codes(None, ignore=["TGL0"])
    assert codes((), extend_select=["TGL001"]) == {"TGL001"}
    assert codes(("TGL0",), ignore=["backward-under-no-grad"], extend_select=["TGL201"]) == {"TGL001", "TGL201"}
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
