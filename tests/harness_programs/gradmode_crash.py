"""Not a grad-mode failure: an unrelated error the probe must not claim."""


def main(device: str = "cpu", steps: int = 8) -> None:
    raise ValueError("unrelated")
