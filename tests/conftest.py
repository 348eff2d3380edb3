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
