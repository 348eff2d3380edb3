"""Per-file budgets: the most bytes and seconds one file may cost a run.

A generated 20 MB file, or a 20,000-term ``a + a + ...`` chain that LibCST's
native parser takes hours over, must not stall or kill a whole run. A file
over its size budget is not read further; a file whose lint exceeds its time
budget is abandoned (its worker process is killed, see
:mod:`torchgradlint.runner`). Either becomes one ``TGL000`` diagnostic that
names the limit and how to raise it; every other file is still linted.

Both are set by ``max-file-size`` (bytes) and ``file-timeout`` (seconds) in
``[tool.torchgradlint]`` and by ``--max-file-size`` / ``--file-timeout`` on the
command line. The defaults sit far above hand-written code (a 5 MiB Python
file is generated; the dev set's largest file lints in well under a second):
see ``docs/reliability.md`` for the figures.
"""

from __future__ import annotations

from dataclasses import dataclass

from .diagnostics import PARSE_ERROR_CODE, Diagnostic

DEFAULT_MAX_FILE_SIZE = 5 * 1024 * 1024
"""Bytes (5 MiB)."""

DEFAULT_FILE_TIMEOUT = 20.0
"""Seconds of wall-clock time for one file's lint."""


@dataclass(frozen=True)
class Budget:
    """The limits for one file.

    Attributes:
        max_file_size: bytes; a larger file is not parsed. ``0`` disables the limit.
        file_timeout: seconds of wall-clock time for one file's lint (read,
            parse, analysis, rules); enforced where the lint runs in a worker
            process. ``0`` disables the limit.
    """

    max_file_size: int = DEFAULT_MAX_FILE_SIZE
    file_timeout: float = DEFAULT_FILE_TIMEOUT

    def too_large(self, size: int) -> bool:
        """Whether ``size`` bytes exceed :attr:`max_file_size`."""
        return 0 < self.max_file_size < size


DEFAULT_BUDGET = Budget()


def _mib(n: float) -> str:
    """``n`` bytes in words: ``"21.0 MiB"`` from 1 MiB up, else ``"6,120 bytes"``."""
    return f"{n / (1024 * 1024):.1f} MiB" if n >= 1024 * 1024 else f"{int(n):,} bytes"


def size_diagnostic(path: str, size: int, budget: Budget) -> Diagnostic:
    """The ``TGL000`` for a file of ``size`` bytes over ``budget.max_file_size``."""
    return Diagnostic(PARSE_ERROR_CODE,
                      f"file is {_mib(size)}, over the max-file-size budget of {_mib(budget.max_file_size)}, "
                      "so it was not linted (raise max-file-size to lint it)",
                      path, 1, 1, 1, 1)


def timeout_diagnostic(path: str, budget: Budget) -> Diagnostic:
    """The ``TGL000`` for a file whose lint ran past ``budget.file_timeout``."""
    return Diagnostic(PARSE_ERROR_CODE,
                      f"linting took longer than the file-timeout budget of {budget.file_timeout:g} s, "
                      "so it was stopped and the file was not linted (raise file-timeout to lint it)",
                      path, 1, 1, 1, 1)


def crash_diagnostic(path: str, how: str) -> Diagnostic:
    """The ``TGL000`` for a file whose worker process died (``how``: e.g.
    ``"signal SIGABRT"``), typically a native abort inside LibCST's parser."""
    return Diagnostic(PARSE_ERROR_CODE,
                      f"the parser process died ({how}) on this file, so it was not linted",
                      path, 1, 1, 1, 1)
