# TGL201 FP (timm tests/test_models.py:621): `.train()` chained on the constructor on purpose; the no_grad
# output is the reference for train-mode forwards with gradient checkpointing that follow.
import torch
from timm import create_model


def test_feature_hook_net_grad_checkpointing_order():
    model = create_model('xception41', pretrained=False, features_only=True).train()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        ref = model(x)                   # TGL201 reported
    model.set_grad_checkpointing(True)
    for _ in range(2):
        out = model(x)
        for o, r in zip(out, ref):
            torch.testing.assert_close(o, r)
        sum(o.mean() for o in out).backward()
