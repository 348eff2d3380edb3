"""Device selection for the harness (imports torch lazily)."""

from __future__ import annotations

class DeviceError(RuntimeError):
    """A device was requested that this machine cannot run (e.g. ``cuda`` without a GPU)."""


def cuda_available() -> bool:
    """``torch.cuda.is_available()``; ``False`` when torch cannot even be imported."""
    try:
        import torch
    except ImportError:  # pragma: no cover - the harness CLI checks torch first
        return False
    return bool(torch.cuda.is_available())


def select_devices(choice: str, cuda: bool | None = None) -> list[str]:
    """Devices to run for ``--device choice``.

    ``cpu`` -> ``["cpu"]``; ``cuda`` -> ``["cuda"]``; ``all`` -> ``["cpu"]`` plus
    ``"cuda"`` when a GPU is present. ``cuda`` defaults to :func:`cuda_available`.

    Raises:
        DeviceError: ``choice`` is ``cuda`` and no GPU is present.
        ValueError: unknown ``choice``.
    """
    if choice not in ("cpu", "cuda", "all"):
        raise ValueError(f"unknown device {choice!r}: expected cpu, cuda or all")
    if choice == "cpu":
        return ["cpu"]
    has_cuda = cuda_available() if cuda is None else cuda
    if choice == "cuda":
        if not has_cuda:
            raise DeviceError("--device cuda: no CUDA device is available (torch.cuda.is_available() is False)")
        return ["cuda"]
    return ["cpu", "cuda"] if has_cuda else ["cpu"]
