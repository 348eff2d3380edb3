# TGL201 FP (avalanche tests/models/test_models.py:324): nothing is trained in this test; `.train()` restores
# the mode after an eval-mode check, and IncrementalClassifier's forward is Linear + mask (its only
# `self.training` read is in `adaptation()`, another file).
import torch
from avalanche.models import IncrementalClassifier


def test_incremental_classifier_update_masking_only_during_training(benchmark, get_mbatch):
    model = IncrementalClassifier(in_features=6)
    for exp in benchmark.train_stream:       # TGL201 reported: "this loop evaluates `model` after training it"
        model.adaptation(exp)
        model.eval()
        for ee in benchmark.train_stream:
            model.adaptation(ee)
        model.train()
        mb = get_mbatch(exp.dataset)[0]
        out = model(mb)
        assert torch.all(out[:, model.active_units == 0] == model.mask_value)
