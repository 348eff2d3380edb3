"""torchgradlint: static analysis for PyTorch autograd anti-patterns.

Linting never imports torch or user code; torch is needed only by the runtime
harness (``pip install torchgradlint[harness]``).
"""

__version__ = "0.1.0"

__all__ = ["__version__", "watch"]


def watch(*args, **kwargs):  # type: ignore[no-untyped-def]
    """Measure autograd defects in a block or function with the runtime probes (needs torch).

    ``with torchgradlint.watch(): train()`` or ``@torchgradlint.watch()``; see
    :class:`torchgradlint.harness.run.watch` for the arguments. torch is imported only
    when this is called, never by ``import torchgradlint``.
    """
    from .harness.run import watch as _watch

    return _watch(*args, **kwargs)
