"""Ctrl-C under the probes: an interrupt is never lost in a probe's finaliser.

Python runs a signal handler at the next bytecode boundary of the main thread. While the
probes watch a program, much of that thread's time goes to code Python calls for us where an
exception cannot propagate: a saved tensor's ``__del__`` when autograd frees it, a weak
reference's callback, a ``gc.callbacks`` entry. A ``KeyboardInterrupt`` raised there is printed as "Exception ignored
in ..." and dropped, so a user's Ctrl-C (or a ``timeout -s INT``) is lost and the training
runs on; measured on a REINFORCE script under ``torchgradlint run``: the interrupt landed in a
saved tensor's ``__del__`` and the run went on for minutes.

:class:`deliver_interrupts` installs, for the length of a probe session, a SIGINT handler
that raises ``KeyboardInterrupt`` as Python's default one does, except when the interrupted
frame is inside a function marked :func:`no_raise`: then it asks again 10 ms later
(:func:`_thread.interrupt_main`), until the main thread is back in code where the exception
propagates. It changes nothing when the program (or a notebook kernel) has its own SIGINT
handler, nor outside the main thread.
"""

from __future__ import annotations

import _thread
import signal
import threading
from types import CodeType, FrameType
from typing import Any, Callable, Optional, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

#: the code of the probes' finalisers and weak-reference callbacks (exceptions raised there are dropped)
_NO_RAISE: set[CodeType] = set()

#: seconds between two tries to deliver a deferred interrupt
RETRY_S = 0.01
#: tries before the interrupt is raised wherever the main thread is (5 s of tries)
MAX_RETRIES = 500


def no_raise(fn: F) -> F:
    """Mark ``fn`` (a ``__del__`` or a weak-reference callback) as a place where an interrupt must wait."""
    _NO_RAISE.add(fn.__code__)
    return fn


def in_no_raise(frame: Optional[FrameType]) -> bool:
    """Whether ``frame`` or one of its callers runs a function marked :func:`no_raise`."""
    while frame is not None:
        if frame.f_code in _NO_RAISE:
            return True
        frame = frame.f_back
    return False


class deliver_interrupts:  # noqa: N801 - a context manager used like a function
    """For the length of the block, a SIGINT that lands in a :func:`no_raise` function is raised
    as ``KeyboardInterrupt`` once the main thread has left it (after at most ``MAX_RETRIES``
    tries of ``RETRY_S`` seconds, it is raised where the thread is).

    Installed only in the main thread and only over Python's default SIGINT handler; the
    previous handler is restored on exit, and a try still pending is cancelled.
    """

    def __init__(self) -> None:
        self._installed = False
        self._retries = 0
        self._timer: Optional[threading.Timer] = None

    def _handler(self, signum: int, frame: Optional[FrameType]) -> None:
        if self._retries < MAX_RETRIES and in_no_raise(frame):
            self._retries += 1
            self._timer = threading.Timer(RETRY_S, _thread.interrupt_main)
            self._timer.daemon = True
            self._timer.start()
            return
        self._retries = 0
        raise KeyboardInterrupt

    def __enter__(self) -> "deliver_interrupts":
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self._handler)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._installed:
            if signal.getsignal(signal.SIGINT) == self._handler:  # the program may have put its own in place
                signal.signal(signal.SIGINT, signal.default_int_handler)
            self._installed = False
