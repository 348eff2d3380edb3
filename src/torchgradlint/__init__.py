"""torchgradlint: static analysis for PyTorch autograd anti-patterns.

Linting never imports torch or user code; torch is needed only by the runtime
harness (``pip install torchgradlint[harness]``).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
