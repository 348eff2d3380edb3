"""TGL201 no-grad-without-eval on short snippets the fixtures do not cover."""

import textwrap

import pytest

from torchgradlint.engine import lint_source
from torchgradlint.rules.no_grad_without_eval import NoGradWithoutEval

HEADER = """
import torch
from torch import nn
model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""


def lines(src: str, header: bool = True) -> list[int]:
    """Lines of the TGL201 findings in ``src`` (after the 5-line header)."""
    text = (HEADER if header else "") + textwrap.dedent(src)
    result = lint_source(text, "x.py", [NoGradWithoutEval])
    offset = HEADER.count("\n") if header else 0
    return [d.line - offset for d in result.diagnostics if d.code == "TGL201"]


TRAIN_LOOP = """
for x in loader:
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()
"""


def test_script_level_training_then_no_grad_is_flagged():
    assert lines(TRAIN_LOOP + """
with torch.no_grad():
    out = model(x_val)
""") == [8]


def test_eval_inside_the_block_before_the_call_is_silent():
    assert lines(TRAIN_LOOP + """
with torch.no_grad():
    model.eval()
    out = model(x_val)
""") == []


def test_eval_before_training_means_deliberate_eval_mode_training():
    assert lines("model.eval()\n" + TRAIN_LOOP + """
with torch.no_grad():
    out = model(x_val)
""") == []


def test_train_with_non_literal_flag_is_unknown():
    assert lines(TRAIN_LOOP + """
model.train(is_training)
with torch.no_grad():
    out = model(x_val)
""") == []


def test_hf_trainer_train_is_not_a_module_train():
    assert lines("""
model.eval()
trainer.train()
with torch.no_grad():
    out = model(x_val)
""") == []


def test_freshly_constructed_module_is_in_training_mode():
    assert lines("""
with torch.no_grad():
    out = model(x_val)
print(out)
""") == [3]


def test_a_dummy_forward_of_a_fresh_module_is_no_evaluation():
    # PyTorch Geometric's hetero examples: ``with torch.no_grad(): out = model(...)  # Initialize lazy
    # modules.`` before the optimizer is built; the output is never read
    for dummy in ("out = model(x_val)", "model(x_val)", "out, aux = model(x_val)"):
        assert lines(f"""
with torch.no_grad():
    {dummy}
optimizer = torch.optim.Adam(model.parameters())
""") == []
    # a function reading its own ``out`` reads another variable
    assert lines("""
with torch.no_grad():
    out = model(x_val)
def train():
    out = model(x)
    return out
""") == []
    # read later (a function that does not bind it reads the module's), or trained before: flagged
    assert lines("""
with torch.no_grad():
    out = model(x_val)
def show():
    print(out)
""") == [3]
    assert lines("""
for x, y in loader:
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
with torch.no_grad():
    out = model(x_val)
""") == [7]


def test_constructed_in_eval_mode_is_silent():
    assert lines("""
frozen = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).eval()
with torch.no_grad():
    out = frozen(x_val)
""") == []


def test_explicit_train_then_inference_mode_is_flagged():
    assert lines("""
model.train()
with torch.inference_mode():
    out = model(x_val)
print(out)
""") == [4]


def test_set_grad_enabled_false_is_flagged_but_flag_variable_is_not():
    assert lines(TRAIN_LOOP + """
with torch.set_grad_enabled(False):
    a = model(x_val)
with torch.set_grad_enabled(phase == "train"):
    b = model(x_val)
""") == [8]


def test_enable_grad_nested_in_no_grad_is_silent():
    assert lines(TRAIN_LOOP + """
with torch.no_grad():
    with torch.enable_grad():
        out = model(x_val)
""") == []


def test_block_without_module_call_is_silent():
    assert lines(TRAIN_LOOP + """
with torch.no_grad():
    for p in model.parameters():
        p.clamp_(-1, 1)
    ema.copy_(model[0].weight)
""") == []


def test_one_finding_per_block_and_module():
    assert lines(TRAIN_LOOP + """
with torch.no_grad():
    a = model(x1)
    b = model(x2)
""") == [8]


def test_constructed_teacher_with_dropout_is_flagged():
    # A module starts in training mode: the teacher's dropout is active under no_grad.
    assert lines("""
teacher = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1))
for x in loader:
    with torch.no_grad():
        soft = teacher(x)
    optimizer.zero_grad()
    (model(x) - soft).pow(2).mean().backward()
    optimizer.step()
""") == [5]


def test_teacher_put_in_eval_is_silent():
    assert lines("""
teacher = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1))
teacher.eval()
for x in loader:
    with torch.no_grad():
        soft = teacher(x)
    optimizer.zero_grad()
    (model(x) - soft).pow(2).mean().backward()
    optimizer.step()
""") == []


def test_same_loop_student_under_no_grad_is_flagged_by_wraparound():
    assert lines("""
for x in loader:
    with torch.no_grad():
        pseudo = model(x_unlabeled).argmax(1)
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()
""") == [4]


def test_eval_at_end_of_loop_body_reaches_next_iteration():
    assert lines("""
model.eval()
for epoch in range(3):
    with torch.no_grad():
        out = model(x_val)
    model.train()
    for x in loader:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
    model.eval()
""") == []


def test_module_without_mode_dependent_layers_is_silent():
    src = """
import torch
from torch import nn
class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)
    def forward(self, x):
        return self.fc(x).relu()
net = MLP()
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for x in loader:
    opt.zero_grad()
    net(x).sum().backward()
    opt.step()
with torch.no_grad():
    y = net(x_val)
"""
    assert lines(src, header=False) == []
    # A base class outside the file may hold dropout or batch norm.
    assert lines(src.replace("(nn.Module)", "(ExternalBackbone)"), header=False) == [17]
    assert lines(src.replace("(nn.Module)", "(nn.Module, Mixin)"), header=False) == [17]
    assert lines(src.replace("nn.Linear(4, 1)", "nn.Sequential(nn.Linear(4, 1), nn.Dropout())"),
                 header=False) == [17]


def test_undecorated_helper_called_under_no_grad_is_flagged_inside():
    assert lines(TRAIN_LOOP + """
def predict(net, data):
    return net(data)

with torch.no_grad():
    out = predict(model, x_val)
""") == [8]


def test_helper_with_one_caller_in_eval_and_one_not_is_flagged():
    assert lines("""
@torch.no_grad()
def evaluate(net, data):
    return net(data)

def fit():
    for x in loader:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
    model.eval()
    evaluate(model, x_val)
    model.train()
    for x in loader:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
    evaluate(net=model, data=x_val)
""") == [4]


def test_helper_whose_callers_all_eval_is_silent():
    assert lines("""
@torch.no_grad
def evaluate(net, data):
    return net(data)

def set_eval(m):
    m.eval()

def fit():
    for x in loader:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
    set_eval(model)
    evaluate(model, x_val)
""") == []


def test_helper_without_callers_is_silent():
    assert lines("""
@torch.no_grad()
def evaluate(net, data):
    return net(data)
""") == []


def test_self_eval_covers_submodules():
    assert lines("""
class Lit(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    def fit(self, loader, opt):
        for x in loader:
            opt.zero_grad()
            self.net(x).sum().backward()
            opt.step()
        self.eval()
        with torch.no_grad():
            return self.net(x_val)
""") == []


def test_self_attribute_trained_in_other_method_is_flagged():
    assert lines("""
class Runner:
    def __init__(self):
        self.net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1)
    def validate(self):
        with torch.no_grad():
            return self.net(x_val)
    def fit(self):
        for x in loader:
            self.opt.zero_grad()
            self.net(x).sum().backward()
            self.opt.step()
        self.validate()
""") == [8]


def test_aliases_and_from_import():
    assert lines("""
import torch as T
from torch import no_grad
model.train()
with no_grad():
    a = model(x)
with T.inference_mode():
    b = model(x)
print(a, b)
""") == [6, 8]


def test_training_helper_effect_reaches_caller():
    assert lines("""
def train_one_epoch(net, loader):
    net.train()
    for x in loader:
        optimizer.zero_grad()
        net(x).sum().backward()
        optimizer.step()

def run():
    for epoch in range(3):
        train_one_epoch(model, loader)
        with torch.no_grad():
            val = model(x_val)
""") == [13]


def test_validation_helper_that_restores_train_mode_then_no_grad_is_flagged():
    assert lines("""
def validate(net):
    net.eval()
    with torch.no_grad():
        r = net(x_val)
    net.train()
    return r

validate(model)
with torch.no_grad():
    again = model(x_val)
""") == [11]


def test_prefilter_keeps_every_grad_mode_spelling():
    for token in ("no_grad", "inference_mode", "set_grad_enabled"):
        assert NoGradWithoutEval.may_fire(f"with torch.{token}(): pass")
    # an explicit ``.train()`` is training evidence for an evaluation loop without no_grad
    assert NoGradWithoutEval.may_fire("model.train()\nfor x in loader:\n    model(x)")
    assert not NoGradWithoutEval.may_fire("model.eval()\nmodel(x)")


def test_self_train_in_a_non_module_class_is_no_evidence():
    assert lines("""
class MyTrainer(ExternalTrainer):
    def run(self):
        self.train()
        with torch.no_grad():
            return self.model(x_val)
""") == []


def test_self_train_in_a_module_class_is_evidence():
    assert lines("""
class Lit(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    def run(self):
        self.train()
        with torch.no_grad():
            return self.net(x_val)
""") == [9]


def test_other_framework_file_is_skipped():
    assert lines("""
import tensorflow as tf
for x in loader:
    loss = model(x)
    loss.backward()
    optimizer.step()
with torch.no_grad():
    out = model(x_val)
""", header=False) == []


def test_loss_module_under_no_grad_is_not_a_model():
    assert lines(TRAIN_LOOP + """
criterion = nn.CrossEntropyLoss()
with torch.no_grad():
    val = criterion(logits, y)
""") == []


def test_hand_written_update_bn_pass_is_silent():
    assert lines(TRAIN_LOOP + """
model.train()
with torch.no_grad():
    for x in loader:
        model(x)
""") == []
    assert lines(TRAIN_LOOP + """
for m in model.modules():
    m.reset_running_stats()
with torch.no_grad():
    for x in loader:
        _ = model(x)
""") == []


def test_train_switched_inside_no_grad_block_is_deliberate():
    # realcode: pytorch-accelerated 0.1.61 examples/vision/faster_rcnn/frcnn/trainer.py:108
    # (torchvision detection models return their losses only in training mode).
    assert lines(TRAIN_LOOP + """
with torch.no_grad():
    model.train()
    losses = model(x_val)
    model.eval()
    preds = model(x_val)
""") == []


def test_part_switched_to_eval_inside_no_grad_block_is_silent():
    # realcode: big-sleep 0.9.1 big_sleep/big_sleep.py:462 (EMA latents put in eval for sampling,
    # the other parts are in eval already).
    assert lines("""
class Imagine(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def train_step(self, x):
        self.model(x).sum().backward()
        self.optimizer.step()
        with torch.no_grad():
            self.model[0].eval()
            self.model.latents.eval()
            out = self.model(x)
            self.model.latents.train()
        return out
""") == []


def test_part_switched_to_eval_before_the_block_is_still_flagged():
    assert lines(TRAIN_LOOP + """
model.backbone.eval()
with torch.no_grad():
    out = model(x_val)
""") == [9]


def test_module_rewrapped_by_prepare_keeps_its_mode_insensitivity():
    # realcode: accelerate 1.15.0 src/accelerate/test_utils/scripts/external_deps/test_ds_multiple_model.py:159
    assert lines("""
class NoiseModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(0.1))

    def forward(self, loss):
        return loss * self.scale

noise = NoiseModel()
noise = accelerator.prepare(noise)
noise.train()
for x in loader:
    with torch.no_grad():
        extra = noise(x)
""") == []
    assert lines("""
noisy = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
noisy = accelerator.prepare(noisy)
noisy.train()
for x in loader:
    with torch.no_grad():
        extra = noisy(x)
    print(extra)
""") == [7]


def test_wrapper_keeps_the_wrapped_modules_eval_mode():
    assert lines("""
model.eval()
model = nn.DataParallel(model)
with torch.no_grad():
    out = model(x_val)
""") == []


def test_own_submodule_under_no_grad_in_forward_follows_the_parent():
    assert lines("""
class Rev(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1))
    def forward(self, x):
        with torch.no_grad():
            y = self.f(x)
        return y + x
""") == []


def test_layer_named_by_a_variable_counts_by_what_the_variable_builds():
    # NYU-DLSP20's space-stretching notebook: random nets built from ``NL = nn.Tanh()``
    assert lines("""
    import torch
    from torch import nn
    NL = nn.Tanh()
    for i in range(5):
        net = nn.Sequential(nn.Linear(2, 5), NL, nn.Linear(5, 2))
        with torch.no_grad():
            y = net(x)
        plot(y)
    """, header=False) == []
    assert lines("""
    import torch
    from torch import nn
    NL = nn.Dropout(0.2)
    for i in range(5):
        net = nn.Sequential(nn.Linear(2, 5), NL, nn.Linear(5, 2))
        with torch.no_grad():
            y = net(x)
        plot(y)
    """, header=False) == [8]


def test_layer_class_named_by_a_variable_counts_by_the_class():
    # NYU-DLSP20's Bayesian-NN notebook: ``non_linear = nn.ReLU`` ... ``non_linear()``
    for classes, expected in ((("ReLU", "Tanh"), []), (("ReLU", "Dropout"), [10])):
        assert lines(f"""
        import torch
        from torch import nn
        def main(x, big):
            act = nn.{classes[0]}
            if big:
                act = nn.{classes[1]}
            net = nn.Sequential(nn.Linear(2, 5), act(), nn.Linear(5, 2))
            with torch.no_grad():
                return net(x)
        """, header=False) == expected, classes


def test_layer_variable_of_unknown_origin_still_counts_as_mode_dependent():
    assert lines("""
    import torch
    from torch import nn
    def build(act):
        net = nn.Sequential(nn.Linear(2, 5), act, nn.Linear(5, 2))
        with torch.no_grad():
            return net(x)
    """, header=False) == [7]


def test_monte_carlo_dropout_after_an_explicit_train_is_silent():
    # NYU-DLSP20's Bayesian-NN notebook: samples of a dropout-only net in training mode on purpose
    assert lines(TRAIN_LOOP + """
model.eval()
with torch.no_grad():
    point = model(x_val)
model.train()
with torch.no_grad():
    samples = [model(x_val) for _ in range(100)]
""") == []
    assert lines(TRAIN_LOOP + """
model.train()
y_hat = list()
with torch.no_grad():
    for t in range(100):
        y_hat.append(model(x_val.view(-1, 1)).squeeze())
""") == []


def test_training_mode_for_one_evaluation_or_a_pass_over_data_is_flagged():
    assert lines(TRAIN_LOOP + """
model.train()
with torch.no_grad():
    once = model(x_val)
print(once)
""") == [9]
    assert lines(TRAIN_LOOP + """
model.train()
with torch.no_grad():
    for x in val_loader:
        each = model(x)
        print(each)
""") == [10]


def test_monte_carlo_sampling_of_a_batch_norm_net_is_still_flagged():
    # training mode also makes batch norm overwrite its running statistics with each sample
    assert lines("""
    import torch
    from torch import nn
    net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))
    net.train()
    with torch.no_grad():
        samples = [net(x) for _ in range(10)]
    """, header=False) == [7]


def test_train_at_the_top_of_an_epoch_that_trains_after_the_evaluation_is_flagged():
    assert lines("""
for epoch in range(3):
    model.train()
    with torch.no_grad():
        sanity = model(x_val)
    for x in loader:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
""") == [5]


def test_train_then_a_module_handed_to_an_unknown_helper_is_flagged():
    assert lines("""
from helpers import train_one_epoch
for epoch in range(3):
    model.train()
    train_one_epoch(model, loader, optimizer)
    with torch.no_grad():
        val = model(x_val)
""") == [7]


D2L_TRAIN = """
import torch
from torch import nn


class MaskedSoftmaxCELoss(nn.CrossEntropyLoss):
    def forward(self, pred, label, valid_length):
        return super().forward(pred, label)


def evaluate_loss(net, data_iter, loss):
    total = 0.0
    for X, y in data_iter:
        total += loss(net(X), y).sum().item()
    return total


def train_ch7(model, data_iter, lr):
    loss = MaskedSoftmaxCELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for X, y in data_iter:
        optimizer.zero_grad()
        loss(model(X), y, None).backward()
        optimizer.step()


def train_ch10(data_iter, w, b):
    net, loss = {net}, nn.MSELoss()
    optimizer = torch.optim.SGD([w, b], lr=0.1)
    for X, y in data_iter:
        optimizer.zero_grad()
        loss(net(X), y).backward()
        optimizer.step()
        print(evaluate_loss(net, data_iter, loss))
"""


def test_an_evaluation_helper_of_a_lambda_and_a_loss_class_evaluates_no_module():
    # d2l-pytorch's d2l/train.py: a same-file loss class is no model to evaluate, and the only caller
    # passes ``net = lambda X: linreg(X, w, b)``
    assert lines(D2L_TRAIN.format(net="lambda X: torch.mm(X, w) + b"), header=False) == []
    # the near miss: the caller passes a trained module with dropout
    assert lines(D2L_TRAIN.format(net="nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))"), header=False) == [13]


def test_a_model_written_as_a_function_is_no_module():
    # d2l-pytorch's softmax regression from scratch: ``def net(X)`` evaluated after training by SGD
    source = """
    import torch
    W = torch.normal(0, 0.01, size=(784, 10), requires_grad=True)
    b = torch.zeros(10, requires_grad=True)

    def net(X):
        return torch.softmax(torch.matmul(X.reshape((-1, 784)), W) + b, dim=1)

    def evaluate_accuracy(data_iter, net):
        acc = 0.0
        for X, y in data_iter:
            acc += (net(X).argmax(dim=1) == y).sum().item()
        return acc

    def train_ch3(net, train_iter, test_iter, loss, params, lr):
        for epoch in range(5):
            for X, y in train_iter:
                loss(net(X), y).sum().backward()
                sgd(params, lr)
            print(evaluate_accuracy(test_iter, net))

    train_ch3(net, train_iter, test_iter, cross_entropy, [W, b], 0.1)
    """
    assert lines(source, header=False) == []


def test_layer_names_in_comments_and_docstrings_are_no_layers():
    # Lightning's UvA-DL GNN tutorial: a GAT layer whose comment links the "Transformers_and_MHAttention"
    # tutorial (LeakyReLU and softmax only) was taken for an attention layer with dropout
    source = """
    import torch
    from torch import nn

    class GATLayer(nn.Module):
        \"\"\"Unlike a Transformer's MultiheadAttention, no Dropout here.\"\"\"

        def __init__(self, c_in, c_out):
            super().__init__()
            # see the Transformers_and_MHAttention tutorial
            self.projection = nn.Linear(c_in, c_out){extra}
            self.leakyrelu = nn.LeakyReLU(0.2)

        def forward(self, x):
            return torch.softmax(self.leakyrelu(self.projection(x)), dim=-1)

    layer = GATLayer(2, 2)
    with torch.no_grad():
        out = layer(x)
    print(out)
    """
    assert lines(source.format(extra=""), header=False) == []
    assert lines(source.format(extra="\n            self.drop = nn.Dropout(0.1)"), header=False) == [20]


HOUSE_PRICES = """
import torch
from torch import nn

loss = nn.MSELoss()


def get_net(feature_num):
    net = {layers}
    for param in net.parameters():
        nn.init.normal_(param, mean=0, std=0.01)
    return net


def log_rmse(net, features, labels):
    with torch.no_grad():
        preds = torch.max(net(features), torch.tensor(1.0))
        return torch.sqrt(loss(preds.log(), labels.log())).item()


def train(net, train_iter, features, labels):
    optimizer = torch.optim.Adam(net.parameters(), lr=0.1)
    net = net.float()
    for X, y in train_iter:
        optimizer.zero_grad()
        loss(net(X), y).backward()
        optimizer.step()
        print(log_rmse(net, features, labels))


net = get_net(10)
train(net, train_iter, features, labels)
"""


def test_a_module_from_a_factory_function_of_the_file_counts_by_what_it_returns():
    # Dive-into-DL-PyTorch's Kaggle house prices: ``get_net`` returns an ``nn.Linear``
    assert lines(HOUSE_PRICES.format(layers="nn.Linear(feature_num, 1)"), header=False) == []
    assert lines(HOUSE_PRICES.format(layers="nn.Sequential(nn.Linear(feature_num, 8), nn.Dropout(0.5))"),
                 header=False) == [17]


def test_a_switch_back_to_training_in_an_early_exit_does_not_wrap_around():
    # pixel2style2pixel's Coach.validate: ``self.net.train(); return None`` after a few sanity batches
    source = """
    import torch
    from torch import nn

    class Coach:
        def __init__(self):
            self.net = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))

        def validate(self):
            self.net.eval()
            for batch_idx, batch in enumerate(self.test_dataloader):
                with torch.no_grad():
                    y_hat = self.net(batch)
                if self.global_step == 0 and batch_idx >= 4:
                    self.net.train()
                    return None
            self.net.train()
    """
    assert lines(source, header=False) == []
    assert lines(source.replace("                    return None\n", ""), header=False) == [13]


def test_evaluation_loop_names_every_trained_module_in_training_mode():
    # GunhoChoi/PyTorch-FastCampus autoencoders: encoder and decoder both hold batch norm
    src = textwrap.dedent("""
        import torch
        from torch import nn
        encoder = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
        decoder = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
        free = nn.Linear(4, 4)
        optimizer = torch.optim.Adam([*encoder.parameters(), *decoder.parameters(), *free.parameters()])
        for x in train_loader:
            optimizer.zero_grad()
            free(decoder(encoder(x))).sum().backward()
            optimizer.step()
        for x in test_loader:
            code = encoder(x)
            out = free(decoder(code))
    """)
    found = [d for d in lint_source(src, "x.py", [NoGradWithoutEval]).diagnostics if d.code == "TGL201"]
    assert [d.line for d in found] == [12]
    assert "evaluates `encoder` and `decoder` after training them" in found[0].message
    assert "call `encoder.eval()` and `decoder.eval()` before the loop" in found[0].detail


_NAMED_CLASSES = """
import torch
from torch import nn

class TransformerBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.RMSNorm(d)
        self.ff = nn.Linear(d, d){extra}

    def forward(self, x):
        return x + self.ff(self.norm(x))

class LlamaModel(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.blocks = nn.ModuleList([TransformerBlock(d) for _ in range(2)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x

model = LlamaModel(8)
model.train()
with torch.no_grad():
    out = model(x)
print(out)
"""


def test_a_class_named_like_a_torch_layer_is_judged_by_its_body():
    """rasbt/LLMs-from-scratch's Llama: ``TransformerBlock`` (RMSNorm and linear layers) is no
    ``nn.Transformer``; with a dropout layer in its body it is mode-sensitive again."""
    assert lines(_NAMED_CLASSES.format(extra=""), header=False) == []
    assert lines(_NAMED_CLASSES.format(extra="\n        self.drop = nn.Dropout(0.1)"), header=False) == [28]


def test_a_subclass_of_torch_transformer_sharing_its_name_stays_mode_sensitive():
    assert lines("""
        import torch
        from torch import nn

        class Transformer(nn.Transformer):
            pass

        model = Transformer(d_model=8, nhead=2)
        model.train()
        with torch.no_grad():
            out = model(src, tgt)
        print(out)
        """, header=False) == [11]


_ATTENTION = """
import torch
from torch import nn

class CausalAttention(nn.Module):
    def __init__(self, d_in, d_out, dropout, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout){extra}

    def forward(self, x):
        return self.dropout(torch.softmax(self.W_query(x), dim=-1))

ca = CausalAttention(3, 2, {rate})
ca.train()
with torch.no_grad():
    out = ca(batch)
print(out)
"""


def test_a_dropout_rate_of_zero_given_to_the_constructor_drops_nothing():
    """rasbt/LLMs-from-scratch's buffers notebook: ``CausalAttention(d_in, d_out, ctx, 0.0)``; the
    class's only dropout is built from that rate, so the instance is mode-free."""
    assert lines(_ATTENTION.format(extra="", rate="0.0"), header=False) == []
    assert lines(_ATTENTION.format(extra="", rate="dropout=0"), header=False) == []
    assert lines(_ATTENTION.format(extra="", rate="0.1"), header=False) == [17]
    assert lines(_ATTENTION.format(extra="", rate="rate"), header=False) == [17]
    # another layer the class builds still counts
    assert lines(_ATTENTION.format(extra="\n        self.norm = nn.BatchNorm1d(d_out)", rate="0.0"),
                 header=False) == [18]


def test_a_model_reloaded_with_from_pretrained_is_in_eval_mode():
    """huggingface/notebooks' BLIP-2 captioning: after fine-tuning, a cell reloads the model with
    ``from_pretrained`` (transformers returns it in eval mode) and captions images under the
    no_grad of ``generate``; evaluating the name before the reload is still reported."""
    src = """
        import torch
        from transformers import Blip2ForConditionalGeneration
        model = Blip2ForConditionalGeneration.from_pretrained("base")
        optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
        model.train()
        for batch in loader:
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        with torch.no_grad():
            before = model(**batch)
        model = Blip2ForConditionalGeneration.from_pretrained("finetuned").to("cuda")
        with torch.no_grad():
            after = model(**batch)
        model = Blip2ForConditionalGeneration.from_pretrained("finetuned", is_trainable=True)
        with torch.no_grad():
            unknown = model(**batch)
        """
    assert lines(src, header=False) == [13]


_ATTACK = """
import torch
from torch import nn

class Attacker:
    def attack(self, images, net):
        inputs = images.clone()
        {mark}
        loss = nn.functional.cross_entropy(net(inputs), labels)
        loss.backward()
        return inputs - 0.01 * inputs.grad.sign()

class Odin:
    def __init__(self):
        self.attacker = Attacker()

    def apply(self, images, net):
        inputs = self.attacker.attack(images, net)
        with torch.no_grad():
            return net(inputs)
"""


def test_a_helper_that_backpropagates_for_input_gradients_does_not_train_the_model():
    """dataflowr's ODIN notebook: the attack backpropagates to perturb the input (FGSM); it reads
    ``inputs.grad`` and steps no optimizer, so it is no training of ``net``."""
    assert lines(_ATTACK.format(mark="inputs.requires_grad = True"), header=False) == []
    assert lines(_ATTACK.format(mark="inputs.requires_grad_()"), header=False) == []
    # without an input marked for its gradient the backward counts as training, as before
    assert lines(_ATTACK.format(mark="pass"), header=False) == [20]


_GENERATE = """
import torch
from transformers import {cls}
model = {cls}.from_pretrained("base")
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
model.train()
for batch in loader:
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
{between}
ids = model.generate(pixel_values=pixel_values, max_length=25)
"""


def test_generate_after_training_runs_under_no_grad_in_training_mode():
    """huggingface/notebooks' BLIP-2 PEFT captioning: trained, then ``model.generate(...)`` with no
    ``eval()`` (transformers' ``generate`` is decorated with ``torch.no_grad()``)."""
    assert lines(_GENERATE.format(cls="Blip2ForConditionalGeneration", between=""), header=False) == [13]
    [d] = lint_source(_GENERATE.format(cls="Blip2ForConditionalGeneration", between=""), "x.py",
                      [NoGradWithoutEval]).diagnostics
    assert d.message == "`model.generate(...)` may run `model` in training mode"
    assert lines(_GENERATE.format(cls="Blip2ForConditionalGeneration", between="model.eval()"), header=False) == []
    # BLIP and the Llama family default every dropout to 0.0: the mode changes nothing
    assert lines(_GENERATE.format(cls="BlipForConditionalGeneration", between=""), header=False) == []
    assert lines(_GENERATE.format(cls="LlamaForCausalLM", between=""), header=False) == []


def test_a_generate_method_of_the_file_is_judged_by_its_body():
    assert lines("""
        import torch
        from torch import nn

        class GPT(nn.Module):
            def __init__(self):
                super().__init__()
                self.drop = nn.Dropout(0.1)

            def generate(self, idx):
                return self.drop(idx)

        model = GPT()
        model.train()
        out = model.generate(idx)
        """, header=False) == []


def test_generate_of_a_project_model_without_transformers_is_not_assumed_no_grad():
    """chenyuntc/pytorch-book's style transfer: ``Model`` (from the project's ``model.py``) has its
    own ``generate``; without transformers in the file nothing says it runs under no_grad."""
    assert lines("""
        import torch
        from model import Model
        model = Model()
        optimizer = torch.optim.Adam(model.parameters())
        for content, style in loader:
            optimizer.zero_grad()
            model(content, style).backward()
            optimizer.step()
            out = model.generate(content, style)
        """, header=False) == []


def test_a_pass_whose_sum_is_backpropagated_after_the_loop_is_training():
    # PyTorch Geometric's mem_pool example: a second pass over the training data sums an auxiliary loss,
    # backpropagated once after the loop
    source = """
    def train():
        model.train()
        for data in loader:
            optimizer.zero_grad()
            F.nll_loss(model(data)[0], data.y).backward()
            optimizer.step()
        kl_loss = 0.
        optimizer.zero_grad()
        for data in loader:
            kl_loss += model(data)[1]
        kl_loss /= len(loader)
        {last}
    """
    assert lines(source.format(last="kl_loss.backward()")) == []
    assert lines(source.format(last="print(float(kl_loss))")) == [10]  # an evaluation pass after training


_GAP = """
import torch
import torch.nn.functional as F
from torch import nn

class Transfer(nn.Module):
    def __init__(self):
        super().__init__()
        self.featurizer = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.2))
        self.classifier = nn.Linear(8, 2)
        self.adversary = nn.Linear(8, 2)
        self.optimizer = torch.optim.SGD(self.parameters(), lr=0.1)

    def loss_gap(self, minibatches):
        worst = None
        for x, y in minibatches:
            loss = F.cross_entropy(self.adversary(self.featurizer(x)), y)
            if worst is None or loss > worst:
                worst = loss
        return worst

    def update(self, minibatches):
        x, y = minibatches[0]
        self.optimizer.zero_grad()
        F.cross_entropy(self.classifier(self.featurizer(x)), y).backward()
        self.optimizer.step()
        gap = 0.5 * self.loss_gap(minibatches)
        {use}
"""


@pytest.mark.parametrize("use, flagged", [
    ("self.optimizer.zero_grad()\n        gap.backward()\n        self.optimizer.step()", False),
    ("return gap.item()", True),  # the worst loss only read: an evaluation pass after training
])
def test_a_pass_whose_result_the_caller_backpropagates_is_training(use, flagged):
    # DomainBed's Transfer: loss_gap loops over the domains' batches and returns the gap between the
    # worst and best loss, which update() backpropagates
    source = _GAP.format(use=use)
    loop_line = source[:source.index("for x, y in minibatches")].count("\n") + 1
    assert lines(source, header=False) == ([loop_line] if flagged else [])


@pytest.mark.parametrize("ctor, expected", [
    ("GCN(16, 32, 2, 4)", []),  # PyG's BasicGNN models: dropout 0.0 and no norm by default
    ("GAT(16, 32, 2, 4, heads=4)", []),
    ("GCN(16, 32, 2, 4, dropout=0.5)", [11]),
    ("GCN(16, 32, 2, 4, 0.5)", [11]),  # dropout given by position
    ("GraphSAGE(16, 32, 2, 4, norm='batch_norm')", [11]),
    ("GIN(16, 32, 2, 4, **cfg)", [11]),  # arguments it cannot see
])
def test_pyg_basic_gnn_models_are_mode_free_unless_given_dropout_or_norm(ctor, expected):
    assert lines(f"""
    import torch
    from torch_geometric.nn import GCN, GAT, GraphSAGE, GIN
    model = {ctor}
    opt = torch.optim.Adam(model.parameters())
    for data in loader:
        opt.zero_grad()
        model(data.x, data.edge_index).sum().backward()
        opt.step()
    with torch.no_grad():
        pred = model(data.x, data.edge_index).argmax(-1)
    print(pred)
    """, header=False) == expected


@pytest.mark.parametrize("extra, expected", [
    ("", []),  # rasbt's machine-learning-book ch13: Linear and ReLU only
    ("all_layers.append(nn.Dropout(0.2))", [16]),
    ("all_layers.extend([nn.BatchNorm1d(4)])", [16]),
    ("all_layers.extend(more)", [16]),  # a list it cannot see
    ("all_layers += [nn.Dropout(0.2)]", [16]),
])
def test_sequential_unpacking_a_list_built_by_appends_counts_its_items(extra, expected):
    assert lines(f"""
    import torch
    from torch import nn
    all_layers = []
    for hidden in [8, 4]:
        layer = nn.Linear(4, hidden)
        all_layers.append(layer)
        all_layers.append(nn.ReLU())
    {extra}
    model = nn.Sequential(*all_layers)
    for x, y in loader:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
    with torch.no_grad():
        pred = model(x_test)
    print(pred)
    """, header=False) == expected


def test_torchvision_feature_extractors_keep_the_wrapped_models_mode():
    # kohya-ss/sd-scripts: ``IntermediateLayerGetter(vgg16_model.features, ...)`` of a VGG put in eval
    # mode by the caller; the getter runs the given submodules, in their own mode
    assert lines("""
    import torch
    import torchvision

    class Pipeline:
        def __init__(self, vgg16_model):
            self.feat = torchvision.models._utils.IntermediateLayerGetter(
                vgg16_model.features, return_layers={"3": "feat"})

        @torch.no_grad()
        def guide(self, images):
            return self.feat(images)["feat"]
    """, header=False) == []


def test_a_feature_cache_forward_of_the_module_trained_in_the_step_is_training():
    # open_clip's gradient accumulation: features of each micro-batch computed under no_grad in training
    # mode, used as negatives by the forward that is backpropagated (through a ``backward`` helper)
    source = """
    import torch

    def backward(total_loss, scaler):
        total_loss.backward()

    def train_step(model, batches, optimizer, scaler):
        cached = []
        with torch.no_grad():
            for b in batches:
                cached.append(model(b))
        optimizer.zero_grad()
        for j, b in enumerate(batches):
            out = model(b)
            loss = contrastive(torch.cat(cached[:j] + [out] + cached[j + 1:]))
            {last}
        optimizer.step()
    """
    assert lines(source.format(last="backward(loss, scaler)")) == []


@pytest.mark.parametrize("lstm, expected", [
    ("DPLSTM(8, 16, batch_first=True)", []),  # opacus's tutorial: like nn.LSTM, no dropout unless given
    ("DPLSTM(8, 16, 1, True, True, 0)", []),
    ("DPLSTM(8, 16, num_layers=2, dropout=0.3)", [22]),
    ("DPLSTM(8, 16, 2, True, True, 0.3)", [22]),  # dropout given by position
    ("DPLSTM(*shape)", [22]),
])
def test_a_class_building_opacus_rnns_is_judged_by_their_dropout(lstm, expected):
    assert lines(f"""
    import torch
    from torch import nn
    from opacus.layers import DPLSTM

    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = {lstm}
            self.out = nn.Linear(16, 3)

        def forward(self, x):
            return self.out(self.lstm(x)[0][:, -1])

    model = Classifier()
    opt = torch.optim.Adam(model.parameters())
    for x, y in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    with torch.no_grad():
        preds = model(x_test).argmax(-1)
    print(preds)
    """, header=False) == expected


def test_a_library_layer_also_passed_as_a_class_stays_unknown():
    assert lines("""
    import torch
    from torch import nn
    from opacus.layers import DPLSTM

    class Classifier(nn.Module):
        def __init__(self, rnn=DPLSTM):
            super().__init__()
            self.lstm = rnn(8, 16)

        def forward(self, x):
            return self.lstm(x)[0][:, -1]

    model = Classifier()
    opt = torch.optim.Adam(model.parameters())
    for x in loader:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    with torch.no_grad():
        preds = model(x_test)
    print(preds)
    """, header=False) == [21]


@pytest.mark.parametrize("use, expected", [
    ("", []),  # BigGAN's standing statistics: the output is assigned and never read
    ("print(x.mean())", [7]),
])
def test_a_statistics_pass_whose_output_is_never_read_is_deliberate(use, expected):
    assert lines(f"""
    def accumulate_standing_stats(net, z, y, num_accumulations=16):
        net.train()
        for i in range(num_accumulations):
            with torch.no_grad():
                z.normal_()
                x = net(z, y)
        {use}
        net.eval()

    for x in loader:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
    accumulate_standing_stats(model, noise, labels)
    """) == expected


_PEFT = """
import torch
from peft import HRAConfig, LoraConfig, get_peft_model
from transformers import LlamaForCausalLM
model = LlamaForCausalLM.from_pretrained("llama")
{adapt}
model.train()  # from_pretrained returns the model in eval mode
opt = torch.optim.AdamW(model.parameters())
for batch in loader:
    opt.zero_grad()
    model(**batch).loss.backward()
    opt.step()
with torch.no_grad():
    out = model(**val)
print(out)
"""


@pytest.mark.parametrize("adapt, expected", [
    ("model = get_peft_model(model, LoraConfig(r=8, lora_dropout=0.0))", []),  # the base is mode-free
    ("model = get_peft_model(model, LoraConfig(r=8))", []),  # PEFT's adapter dropout defaults to 0.0
    ("config = HRAConfig(r=8)\nmodel = get_peft_model(model, config)", []),
    ("model = get_peft_model(model, LoraConfig(r=8, lora_dropout=0.05))", [14]),
    ("model = get_peft_model(model, LoraConfig(**options))", [14]),
    ("model = get_peft_model(model, config)", [14]),  # a config the file does not show
])
def test_a_peft_adapter_is_mode_sensitive_through_its_dropout_and_its_base(adapt, expected):
    found = lines(_PEFT.format(adapt=adapt), header=False)
    assert found == [e + adapt.count("\n") for e in expected]


def test_a_peft_adapter_of_a_base_with_dropout_stays_sensitive():
    assert lines("""
    import torch
    from torch import nn
    from peft import LoraConfig, get_peft_model
    base = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1), nn.Linear(4, 1))
    model = get_peft_model(base, LoraConfig(r=2))
    opt = torch.optim.AdamW(model.parameters())
    for x in loader:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    with torch.no_grad():
        out = model(x_val)
    print(out)
    """, header=False) == [13]


_PERIODIC_VALIDATION = """
import torch
from unet import UNet

net = UNet(in_channels=3)
opt = torch.optim.Adam(net.parameters())
for epoch in range(10):
    net.train()
    for x, y in loader:
        opt.zero_grad()
        loss = (net(x) - y).pow(2).mean()
        loss.backward()
        opt.step()
    {validate}
        net.eval()
        with torch.no_grad():
            print(net(x_val))
with torch.no_grad():
    out = net(x_vis)
print(out)
"""


def test_an_eval_in_a_branch_leaves_the_final_test_in_training_mode_when_the_branch_is_skipped():
    # zhangxiann/PyTorch_Practice's portrait matting: validation every val_interval epochs, then a final
    # visualisation after the loop, in training mode whenever the last epoch did not validate
    assert lines(_PERIODIC_VALIDATION.format(validate="if (epoch + 1) % 3 == 0:"), header=False) == [19]
    # a validation every epoch (the eval always runs): the final pass is in eval mode
    assert lines(_PERIODIC_VALIDATION.format(validate="for _ in range(1):"), header=False) == []


def test_a_guarded_eval_that_always_leaves_eval_mode_counts():
    # torchattacks: ``given_training = model.training; if given_training: model.eval()``
    assert lines("""
    import torch

    def predict(self, inputs):
        given_training = self.model.training
        if given_training:
            self.model.eval()
        with torch.no_grad():
            outputs = self.model(inputs)
        if given_training:
            self.model.train()
        return outputs

    for x, y in loader:
        optimizer.zero_grad()
        self.model(x).sum().backward()
        optimizer.step()
    """) == []
    # sgrvinod's image captioning: ``if encoder is not None: encoder.eval()``
    assert lines("""
    import torch

    def validate(loader, encoder, decoder):
        decoder.eval()
        if encoder is not None:
            encoder.eval()
        with torch.no_grad():
            for imgs, caps in loader:
                scores = decoder(encoder(imgs) if encoder is not None else imgs, caps)
                print(scores)

    encoder, decoder = nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    for imgs, caps in loader:
        optimizer.zero_grad()
        decoder(encoder(imgs), caps).sum().backward()
        optimizer.step()
    validate(loader, encoder, decoder)
    """, header=False) == []


def test_the_else_of_an_isinstance_module_test_holds_no_module():
    # d2l's evaluate_accuracy: from-scratch models are plain functions
    assert lines("""
    def evaluate_accuracy(data_iter, net):
        acc = 0.0
        with torch.no_grad():
            for X, y in data_iter:
                if isinstance(net, torch.nn.Module):
                    net.eval()
                    acc += (net(X).argmax(dim=1) == y).sum().item()
                    net.train()
                else:
                    acc += (net(X).argmax(dim=1) == y).sum().item()
        return acc

    for x, y in loader:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
    print(evaluate_accuracy(test_iter, model))
    """) == []


def test_a_type_test_in_an_initialiser_builds_no_layer():
    # zhangxiann's LeNet: ``initialize_weights`` tests isinstance(m, nn.BatchNorm2d); the net has none
    assert lines("""
    import torch
    from torch import nn

    class LeNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(x)

        def initialize_weights(self):
            for m in self.modules():
                if isinstance(m, (nn.BatchNorm2d, nn.BatchNorm1d)):
                    m.weight.data.fill_(1)

    net = LeNet()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for x in loader:
        opt.zero_grad()
        net(x).sum().backward()
        opt.step()
    with torch.no_grad():
        print(net(x_test))
    """, header=False) == []


def test_a_mode_chosen_by_a_flag_in_both_branches_is_the_flags_choice():
    # timm's onnx export: ``if training: model.train() else: model.eval()`` then a pass under inference_mode
    src = """
    import torch

    def export(model, training=False):
        if training:
            model.train()
        else:
            model.eval()
        with torch.inference_mode():
            out = model(example)
        return out

    for x in loader:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
    export(model)
    """
    assert lines(src) == []
    # an ``if`` without ``else``: the mode before it may still hold
    assert lines(src.replace("        else:\n            model.eval()\n", "")) == [8]


def test_an_eval_for_modules_only_covers_a_call_after_it():
    # d2l's evaluate_accuracy: ``if isinstance(net, nn.Module): net.eval()``, then the pass for any net
    assert lines("""
    def evaluate_accuracy(net, data_iter):
        if isinstance(net, nn.Module):
            net.eval()
        with torch.no_grad():
            return sum((net(X).argmax(1) == y).sum().item() for X, y in data_iter)

    for x in loader:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
    print(evaluate_accuracy(model, test_iter))
    """) == []


@pytest.mark.parametrize("layer, expected", [
    ("nn.Linear(wandb.config.hidden, 10)", []),  # W&B's sagemaker example: a config read builds no layer
    ("timm.create_model(wandb.config.arch)", [22]),  # a backbone built by another package: not visible
])
def test_an_imported_name_counts_when_it_may_build_a_layer(layer, expected):
    assert lines(f"""
    import torch
    import timm
    import wandb
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = {layer}

        def forward(self, x):
            return self.body(x)

    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for x in loader:
        opt.zero_grad()
        net(x).sum().backward()
        opt.step()
    with torch.no_grad():
        print(net(x_test))
    """, header=False) == expected


@pytest.mark.parametrize("extra, expected", [("", []), (", nn.Dropout(0.2)", [23])])
def test_a_model_built_by_a_method_of_the_class_is_judged_by_what_it_returns(extra, expected):
    # W&B's sacred example: ``self.model = self.make_model()``
    assert lines(f"""
    import torch
    from torch import nn

    class Runner:
        def __init__(self):
            self.model = self.make_model()
            self.optimizer = torch.optim.Adam(self.model.parameters())

        def make_model(self):
            return nn.Sequential(nn.Linear(4, 8), nn.ReLU(){extra}, nn.Linear(8, 2))

        def train(self, loader, x_test):
            for epoch in range(3):
                for x, y in loader:
                    self.optimizer.zero_grad()
                    nn.functional.cross_entropy(self.model(x), y).backward()
                    self.optimizer.step()
                print(self.test(x_test))

        def test(self, x):
            with torch.no_grad():
                return self.model(x).argmax(1)

    Runner().train(loader, x_test)
    """, header=False) == expected


_MONAI = """
import torch
from torch import nn
from monai.networks.utils import eval_mode
model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.2), nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    model.train()
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    with {manager}:
        for x, y in val_loader:
            out = model(x)
"""


@pytest.mark.parametrize("manager, flagged", [
    ("eval_mode(model)", False),  # MONAI: eval() and torch.no_grad() for the block, modes restored after
    ("eval_mode(other)", True),  # another module put in eval mode
    ("torch.no_grad()", True),
])
def test_monai_eval_mode_puts_the_module_in_eval_mode(manager, flagged):
    # Project-MONAI/tutorials' lung-lesion classifier evaluates ``with eval_mode(model):``
    found = lines(_MONAI.format(manager=manager), header=False)
    assert bool(found) == flagged, found


_REDEFINED_CELLS = """
def get_model():
    model = nn.Sequential(nn.Linear(784, 100), {layers}nn.ReLU(), nn.Linear(100, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, nn.CrossEntropyLoss(), optimizer


def accuracy(x, y, model):
    with torch.no_grad():
        prediction = model(x)
    return (prediction.argmax(-1) == y).float().mean().item()


model, loss_fn, optimizer = get_model()
for epoch in range(5):
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    for x, y in loader:
        acc = accuracy(x, y, model)
"""


@pytest.mark.parametrize("layers, flagged", [
    ("", [False, True]),  # the first model is mode-free: only the batch-norm model of the later cells is flagged
    ("nn.Dropout(0.5), ", [True, True]),
])
def test_a_notebook_that_redefines_its_factory_judges_each_model_by_its_own_definition(layers, flagged):
    # PacktPublishing's Modern-Computer-Vision-with-PyTorch, Chapter03/Batch_normalization.ipynb:
    # ``get_model()`` and ``accuracy()`` are redefined in a later cell with a batch-norm model;
    # ``model, loss_fn, optimizer = get_model()`` runs the definition before it
    first = _REDEFINED_CELLS.format(layers=layers)
    src = "import torch\nfrom torch import nn\n" + first + _REDEFINED_CELLS.format(layers="nn.BatchNorm1d(100), ")
    calls = [n + 1 for n, line in enumerate(src.splitlines()) if "prediction = model(x)" in line]
    assert lines(src, header=False) == [c for c, f in zip(calls, flagged) if f]


_ODENET = """
import torch
from torch import nn


def norm(dim):
    return {norm}


head = [nn.Conv2d(1, 64, 3, 1), norm(64), nn.ReLU(inplace=True)]
features = [nn.Conv2d(64, 64, 3, 1, 1)] if use_conv else [nn.Conv2d(64, 64, 1) for _ in range(6)]
model = nn.Sequential(*head, *features, norm(64), nn.Flatten(), nn.LazyLinear(10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    with torch.no_grad():
        val = model(x_val)
"""


@pytest.mark.parametrize("norm, flagged", [("nn.GroupNorm(min(32, dim), dim)", False), ("nn.BatchNorm2d(dim)", True)])
def test_a_list_chosen_by_a_conditional_expression_is_read_in_both_branches(norm, flagged):
    # rtqichen/torchdiffeq's odenet_mnist: ``feature_layers = [ODEBlock(...)] if is_odenet else
    # [ResBlock(64, 64) for _ in range(6)]`` unpacked into ``nn.Sequential`` with group norm only
    found = lines(_ODENET.format(norm=norm), header=False)
    assert bool(found) == flagged, found


def test_a_closure_named_like_a_model_is_a_function():
    # yandex-research/rtdl-revisiting-models: ``def apply_model(x): return model(x, x_cat=None)`` inside
    # the training function, called under ``no_grad`` after ``model.eval()``
    src = """
    import torch
    from torch import nn

    def train_eval_net(model, X, Y):
        def apply_model(x):
            return model(x, x_cat=None)

        @torch.no_grad()
        def evaluate():
            model.eval()
            return apply_model(X)

        for epoch in range(10):
            model.train()
            loss = ((apply_model(X) - Y) ** 2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            evaluate()
    """
    assert lines(src, header=False) == []


_PLAIN = """
import torch
from torch import nn


class Ensemble{base}:
    def __init__(self):
        self.models = []
        self.drop = nn.Dropout(0.5)

    def parameters(self):
        return [p for m in self.models for p in m.parameters()]

    def forward(self, x):
        return self.drop(sum(m(x) for m in self.models))


net_ensemble = Ensemble()
optimizer = torch.optim.Adam(net_ensemble.parameters())
for x, y in loader:
    optimizer.zero_grad()
    ((net_ensemble.forward(x) - y) ** 2).mean().backward()
    optimizer.step()
with torch.no_grad():
    out = net_ensemble.forward(x_val)
"""


@pytest.mark.parametrize("base, flagged", [("", False), ("(nn.Module)", True)])
def test_an_instance_of_a_plain_class_with_its_own_parameters_is_no_module(base, flagged):
    # yandex-research's GrowNet: ``DynamicNet``, a plain class holding the boosted models, with its own
    # ``parameters()``, ``to_eval()`` and ``to_train()``
    found = lines(_PLAIN.format(base=base), header=False)
    assert bool(found) == flagged, found


def test_a_factory_that_unpacks_a_call_of_itself_ends_the_search():
    # a recursive factory must not send the unpacking search round forever (a RecursionError would turn
    # the whole file into one TGL000)
    src = """
    import torch
    from torch import nn

    def get_model(depth):
        if depth:
            model, opt = get_model(depth - 1)
            return model, opt
        model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
        return model, torch.optim.SGD(model.parameters(), lr=0.1)

    model, opt = get_model(3)
    for x in loader:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    with torch.no_grad():
        out = model(x)
    """
    result = lint_source(textwrap.dedent(src), "x.py", [NoGradWithoutEval])
    assert [d.code for d in result.diagnostics] == ["TGL201"]


GATED = """
import torch
import torch.nn as nn

class WindowClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.dropout = nn.Dropout(0.3)
        {extra}

    def forward(self, x, is_training=False):
        h = self.fc(x)
        if is_training:
            h = self.dropout(h)
        return {ret}

model = WindowClassifier()
optimizer = torch.optim.Adam(model.parameters())
for x, y in loader:
    optimizer.zero_grad()
    loss_function(model(x, is_training=True), y).backward()
    optimizer.step()
for x, y in test_data:
    pred = model({args}).max(1)[1]
"""


@pytest.mark.parametrize("args, extra, ret, flagged", [
    ("x", "", "h", False),  # DSKSD/DeepNLP-models-Pytorch: dropout only when asked
    ("x, is_training=False", "", "h", False),
    ("x, False", "", "h", False),
    ("x, True", "", "h", True),
    ("x, is_training=flag", "", "h", True),  # unknown value
    ("*batch", "", "h", True),
    ("x", "self.bn = nn.BatchNorm1d(4)", "self.bn(h)", True),  # a layer outside the gate
    ("x", "", "self.dropout(h)", True),  # the gated layer also runs outside the gate
])
def test_a_forward_that_runs_dropout_only_when_asked_is_judged_by_the_call(args, extra, ret, flagged):
    src = GATED.format(args=args, extra=extra, ret=ret)
    assert bool(lines(src, header=False)) is flagged


def test_a_gated_forward_under_no_grad_is_judged_by_the_call():
    src = GATED.replace("for x, y in test_data:\n    pred = model({args}).max(1)[1]",
                        "with torch.no_grad():\n    a = model(x)\nwith torch.no_grad():\n    b = model(x, True)")
    assert lines(src.format(extra="", ret="h"), header=False) == [27]


PLAIN_CLASS = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.fc(x))


class Tester{base}:
    def __init__(self, path):
        self.net = Net()
        self.net.load_state_dict(torch.load(path))
        {setup}

    def test(self, x):
        with torch.no_grad():
            out = self.net(x)
        return out
{extra}
"""


@pytest.mark.parametrize("base, setup, extra, flagged", [
    ("", "", "", True),  # a tester that loads weights and never calls eval()
    ("(object)", "self.net.train()", "", True),  # a switch to training mode is no switch to eval
    ("(nn.Module)", "", "", False),  # a submodule follows the mode its caller sets on the parent
    ("(Base)", "", "", False),  # a base of another file may be an nn.Module
    ("", "self.net.eval()", "", False),
    ("", "self.net.train(False)", "", False),
    ("", "self.nets = [self.net]\n        for n in self.nets:\n            n.eval()", "", False),
    ("", "getattr(self, 'net').eval()", "", False),
    ("", "", "t = Tester('w.pt')\nt.net.eval()", False),  # switched by the file's own code
])
def test_a_module_built_by_a_plain_class_is_in_training_mode_in_its_methods(base, setup, extra, flagged):
    src = PLAIN_CLASS.format(base=base, setup=setup, extra=extra)
    if base == "(Base)":
        src = src.replace("from torch import nn", "from torch import nn\nfrom base import Base")
    assert bool(lines(src, header=False)) is flagged


def test_a_pretrained_module_forwarded_once_is_evaluated_not_initialised():
    # a dummy forward initialises lazy modules of a fresh model; a model-zoo or loaded model has
    # no lazy modules left: its training-mode forward rewrites the pretrained batch-norm statistics
    assert lines("""
import torch
import torchvision
clf = torchvision.models.resnet18(weights="DEFAULT")
with torch.no_grad():
    scores = clf(batch)
""", header=False) == [6]
    assert lines("""
with torch.no_grad():
    out = model(x_val)
optimizer = torch.optim.Adam(model.parameters())
""") == []
    assert lines("""
model.load_state_dict(torch.load("w.pt"))
with torch.no_grad():
    out = model(x_val)
""") == [4]


@pytest.mark.parametrize("layer, flagged", [
    ("nn.Conv2d(3, 3, 3, bias=False, groups=3)", False),  # PyContrast's GaussianBlur: fixed convolutions
    ("nn.BatchNorm2d(3)", True),
])
def test_a_container_of_self_attributes_is_judged_by_what_the_class_binds_to_them(layer, flagged):
    src = f"""
import torch
from torch import nn


class GaussianBlur(object):
    def __init__(self, k):
        self.blur_h = {layer}
        self.blur_v = nn.Conv2d(3, 3, kernel_size=(1, k), bias=False, groups=3)
        self.blur = nn.Sequential(nn.ReflectionPad2d(k // 2), self.blur_h, self.blur_v)

    def __call__(self, img):
        with torch.no_grad():
            img = self.blur(img)
        return img
"""
    assert bool(lines(src, header=False)) is flagged


# A script tail: the module built by ``{ctor}`` is trained, then evaluated under ``no_grad``.
TRAINED_THEN_EVALUATED = """

model = {ctor}
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x in loader:
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()
with torch.no_grad():
    out = model(x_val)
print(out)
"""


CONFIGURED = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim, norm="bn", p=0.0):
        super().__init__()
        if norm == "bn":
            self.norm = nn.BatchNorm1d(dim)
        elif norm in ("ln", "layer"):
            self.norm = nn.LayerNorm(dim)
        else:
            self.norm = nn.Identity()
        if not p:
            self.drop = nn.Identity()
        else:
            self.drop = nn.Dropout(p)

    def forward(self, x):
        return self.drop(self.norm(x))

""" + TRAINED_THEN_EVALUATED


@pytest.mark.parametrize("ctor, flagged", [
    ("Block(4)", True),  # the default: batch norm
    ('Block(4, "ln")', False),
    ('Block(4, norm="layer")', False),
    ('Block(4, norm="none")', False),
    ('Block(4, norm="ln", p=0.1)', True),
    ('Block(4, norm=kind)', True),  # not a literal
    ('nn.Sequential(Block(4, "ln"), Block(4, "none"))', False),
    ('nn.Sequential(Block(4, "ln"), Block(4))', True),
])
def test_a_same_file_class_is_judged_by_the_literal_arguments_of_its_construction(ctor, flagged):
    assert bool(lines(CONFIGURED.format(ctor=ctor), header=False)) is flagged


@pytest.mark.parametrize("test, expected", [
    ("p == 'a'", True), ("p != 'a'", False), ("p == 'b'", False), ("p in ('a', 'b')", True),
    ("p not in ['a']", False), ("not p", False), ("p and q", None), ("p or q", True), ("q", None),
    ("p is None", False), ("r is None", True), ("n > 1", None), ("p == other", None),
])
def test_literal_arguments_decide_branch_tests(test, expected):
    import libcst as cst

    from torchgradlint.analysis.class_arguments import decide
    assert decide(cst.parse_expression(test), {"p": "a", "r": None, "n": 2}) is expected


def test_a_checkpoint_path_built_from_a_constant_names_the_saved_model():
    # improved-wgan-pytorch: ``torch.save(aD, OUTPUT_PATH + "d.pt")`` and, when restoring,
    # ``aD = torch.load(OUTPUT_PATH + "d.pt")``; ``aD = aD.to(device)`` adds no class
    src = """
import torch
from torch import nn
OUTPUT_PATH = "./out/"
if restore:
    model = torch.load(OUTPUT_PATH + "d.pt")
else:
    model = nn.Sequential(nn.Linear(4, 4), nn.{layer}())
model = model.to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x in loader:
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()
    torch.save(model, OUTPUT_PATH + "d.pt")
with torch.no_grad():
    out = model(x_val)
print(out)
"""
    assert lines(src.format(layer="ReLU"), header=False) == []
    assert lines(src.format(layer="Dropout"), header=False) == [17]


BUILDER = """
import torch
from torch import nn


def fc_block(in_, out_, use_bn=True):
    return nn.Sequential(nn.Linear(in_, out_), nn.ReLU(), {norm})


def weights_init(m):
    if m.__class__.__name__.find("BatchNorm") != -1:
        m.weight.data.normal_(1.0, 0.02)


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(fc_block(784, 64), fc_block(64, 8))
        self.apply(weights_init)

    def forward(self, x):
        return self.encoder(x)

""" + TRAINED_THEN_EVALUATED.replace("{ctor}", "VAE()")


@pytest.mark.parametrize("norm, flagged", [
    ("nn.BatchNorm1d(out_) if use_bn else nn.Identity()", True),  # Coderx7's autoencoders
    ("nn.Identity()", False),  # ``self.apply(weights_init)`` hands over, builds nothing
])
def test_a_class_is_judged_by_the_same_file_functions_it_calls_to_build_layers(norm, flagged):
    assert bool(lines(BUILDER.format(norm=norm), header=False)) is flagged


AUTOENCODER = """
import torch
from torch import nn


class AE(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 4), nn.BatchNorm1d(4), nn.ReLU())
        self.decoder = nn.Sequential(nn.Linear(4, 8))
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.decoder(self.encoder(x))

    def get_code(self, x):
        return self.encoder(x)

    def decode(self, z):
        return self.decoder(z)

    def classify(self, x):
        return self.head(self.get_code(x))

    def predict(self, x):
        self.eval()
        return self(x)

    @staticmethod
    def make(n):
        return AE()


ae = AE().to("cpu")
opt = torch.optim.Adam(ae.parameters())
for x in loader:
    opt.zero_grad()
    ((ae(x) - x) ** 2).mean().backward()
    opt.step()
with torch.no_grad():
    out = ae.{call}
"""


@pytest.mark.parametrize("call, fires", [
    # 117XinyuLi's stacked autoencoders: ``model1.get_code(data)`` scored under no_grad in training mode
    ("get_code(x)", True),
    ("classify(x)", True),  # reaches the batch-norm encoder through ``self.get_code``
    ("decode(z)", False),  # runs the linear decoder only
    ("predict(x)", False),  # switches to eval mode itself
    ("make(3)", False),  # a static method runs no layer of ``ae``
])
def test_a_method_of_a_module_class_runs_the_layers_it_reads(call, fires):
    src = AUTOENCODER.format(call=call)
    result = lint_source(textwrap.dedent(src), "x.py", [NoGradWithoutEval])
    found = [d.line for d in result.diagnostics if d.code == "TGL201"]
    assert not [d for d in result.diagnostics if d.code == "TGL000"]
    assert found == ([src.count("\n", 0, src.index("out = ae.")) + 1] if fires else [])


def test_a_module_method_after_eval_is_silent():
    src = AUTOENCODER.format(call="get_code(x)").replace("with torch.no_grad():", "ae.eval()\nwith torch.no_grad():")
    result = lint_source(src, "x.py", [NoGradWithoutEval])
    assert [d for d in result.diagnostics if d.code in ("TGL201", "TGL000")] == []


VOLATILE = """
import torch
import torchvision
from torch import nn
from torch.autograd import Variable

{build}
for img, label in loader:
    img = Variable(img, volatile=True).cuda()
    {rebind}out = net(img)
    features.append(out.data)
"""


@pytest.mark.parametrize("build, rebind, fires", [
    # huanfengAI's dogcat features: a pre-0.4 ``volatile`` input, meant as no_grad, the backbone in training mode
    ("net = torchvision.models.inception_v3(pretrained=True)", "", True),
    ("net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))", "", True),
    ("net = torchvision.models.inception_v3(pretrained=True)\nnet.eval()", "", False),
    ("net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())", "", False),  # nothing depends on the mode
    ("net = q_func(4, 2)", "", False),  # a model of another file: not visibly mode-dependent
    # the input rebound without ``volatile`` before the call: no evaluation marker reaches it
    ("net = torchvision.models.inception_v3(pretrained=True)", "img = Variable(img.data)\n    ", False),
])
def test_a_volatile_variable_marks_an_evaluation(build, rebind, fires):
    src = VOLATILE.format(build=build, rebind=rebind)
    result = lint_source(src, "x.py", [NoGradWithoutEval])
    found = [d for d in result.diagnostics if d.code in ("TGL201", "TGL000")]
    assert [d.code for d in found] == (["TGL201"] if fires else [])
    if fires:
        assert "volatile=True" in found[0].message and "PyTorch 0.4" in found[0].detail


WRAPPER = """
import torch
from torch import nn


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerDecoderLayer(8, 2, dim_feedforward=16, batch_first=True)

    def forward(self, x, memory):
        return self.layer(x, memory)


class Cached(nn.Module):
    def __init__(self, base: Decoder):
        super().__init__()
        self.base = base
        self.head = nn.Sequential(self.base, nn.Identity())

    def step(self, x, memory):
        {body}


@torch.no_grad()
def decode(model, memory):
    return model.step(memory, memory)


cached = Cached(Decoder())
out = decode(cached, memory)
"""


@pytest.mark.parametrize("body, fires", [
    # kierandidi's KV-cache exercise: the method is a stub, it runs none of the wrapped decoder's dropout
    ("raise NotImplementedError", False),
    ("return self.base(x, memory)", True),
    ("return self.head(x)", True),  # built from ``self.base`` in ``__init__``
])
def test_a_method_through_a_helper_parameter_is_judged_by_what_it_runs(body, fires):
    src = WRAPPER.format(body=body)
    result = lint_source(src, "x.py", [NoGradWithoutEval])
    found = [d for d in result.diagnostics if d.code in ("TGL201", "TGL000")]
    assert [d.code for d in found] == (["TGL201"] if fires else [])


SHAPE_CHECK = """
import torch
from torch import nn

net = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1), nn.Linear(4, 2)){load}
x = torch.randn(3, 4)
with torch.no_grad():
    out = net(x)
{after}
"""


@pytest.mark.parametrize("load, after, fires", [
    # ProgramerSalar's UNet and VAE decoder smoke tests: a fresh model's output read only for its shape
    ("", "print(out.shape)", False),
    ("", "assert out.size(1) == 2 and out.dtype == torch.float32 and len(out) == 3", False),
    ("", "print(out.shape, out.mean())", True),  # a value read: an evaluation of the fresh model
    ("\nnet.load_state_dict(torch.load('net.pt'))", "print(out.shape)", True),  # trained weights: an evaluation
])
def test_a_fresh_model_forwarded_for_its_output_shape_is_no_evaluation(load, after, fires):
    src = SHAPE_CHECK.format(load=load, after=after)
    result = lint_source(src, "x.py", [NoGradWithoutEval])
    found = [d.code for d in result.diagnostics if d.code in ("TGL201", "TGL000")]
    assert found == (["TGL201"] if fires else [])
