"""Not a grad-mode defect: a RuntimeError with autograd's wording, raised by user code."""
import torch


def main(device: str = "cpu", steps: int = 8) -> None:
    x = torch.randn(3, requires_grad=True)
    (x * 2).sum().backward()
    raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
