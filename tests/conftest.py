import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
sys.path.insert(0, str(ROOT / "tests"))

import pytest  # noqa: E402


@pytest.fixture
def isolated_cwd(tmp_path, monkeypatch):
    """Run the test in an empty ``tmp_path`` with a fresh per-folder config cache."""
    from torchgradlint import config

    config.clear_cache()
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    config.clear_cache()


# Tests of more than about 2 s that live in modules without their own
# ``pytest.mark.slow`` (``python -m pytest -m "not slow"`` skips them; CI runs all).
SLOW_MODULES = {"test_probes.py"}  # each runs a torch program under a probe
SLOW_TESTS = {
    "test_harness.py::test_harness_cli_end_to_end",
    "test_harness.py::test_disagreement_exits_nonzero_and_names_fixture_probe_figure",
    "test_flake8.py::test_flake8_reports_exactly_the_cli_findings_on_fixtures",
    "test_flake8.py::test_flake8_honours_noqa",
    "test_flake8.py::test_flake8_stdin_honours_the_pyproject_table_like_check",
    "test_flake8.py::test_flake8_rejects_an_unknown_tgl_selector_like_check",
    "test_cache.py::test_concurrent_runs_are_safe",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.path.name
        if module in SLOW_MODULES or f"{module}::{item.originalname}" in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
