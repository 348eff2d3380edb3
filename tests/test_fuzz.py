"""Fuzzing in CI (bounded to about a minute): generated programs
(hypothesmith, from Python's grammar) and random mutations of the fixtures
must never give a traceback, exit 0 or 1, and ``--fix`` must leave a file
that parses and that a second ``--fix`` leaves alone. Longer runs:
``python scripts/fuzz.py``."""

import random

import pytest

hypothesis = pytest.importorskip("hypothesis")
hypothesmith = pytest.importorskip("hypothesmith")

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from fuzzing import FIXTURE_TEXTS, TRAINING_CONTEXT, check_text, mutate, parses  # noqa: E402

BOUNDED = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                          HealthCheck.filter_too_much])


@BOUNDED
@given(program=hypothesmith.from_grammar())
def test_generated_programs(program, tmp_path_factory):
    failure = check_text(TRAINING_CONTEXT + program, tmp_path_factory.mktemp("gen"))
    assert failure is None, failure


@BOUNDED
@given(fixture=st.sampled_from(FIXTURE_TEXTS), seed=st.integers(0, 2**32 - 1),
       edits=st.integers(1, 4), extra=hypothesmith.from_grammar("single_input"))
def test_mutated_fixtures(fixture, seed, edits, extra, tmp_path_factory):
    rng = random.Random(seed)
    text = fixture
    for _ in range(edits):
        text = mutate(text, rng, extra)
    failure = check_text(text, tmp_path_factory.mktemp("mut"))
    assert failure is None, failure


def test_the_property_reads_the_file_without_newline_translation(tmp_path):
    # Found by scripts/fuzz.py (seed 2311): CPython accepts a backslash continuation before the
    # end of the file after "\r\n", not after "\n"; reading the --fix output with newline
    # translation made an unchanged file "not parse".
    text = "import torch\nfor batch in data:\n    loss = model(batch)\n    loss.backward()\n    opt.step()\n\r\n \\\r\n"
    assert parses(text) and not parses(text.replace("\r\n", "\n"))
    assert check_text(text, tmp_path) is None
