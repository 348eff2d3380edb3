"""Source snippets shared by the CLI, config, output-format and pre-commit tests."""

import textwrap

# A script-level training loop without zero_grad: one TGL001 at 8:5 (opt.step()).
MISSING_ZERO_GRAD = textwrap.dedent("""\
    import torch

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        loss = model(torch.randn(2, 4)).sum()
        loss.backward()
        opt.step()
""")
