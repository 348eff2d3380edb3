"""TGL305 fp16-adam-eps on short snippets the fixtures do not cover."""

from rule_snippets import finding_lines

from torchgradlint.rules.fp16_adam_eps import Fp16AdamEps


def lines(src: str) -> list[int]:
    return finding_lines(Fp16AdamEps, src)


def test_half_then_adam_default_eps_is_flagged():
    assert lines("""
        import torch
        model = torch.nn.Linear(4, 4)
        model.half()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    """) == [5]


def test_constructor_chain_alias_and_family():
    assert lines("""
        import torch.optim as O
        from torch import nn
        from torch.optim import NAdam
        class Net(nn.Module):
            pass
        net = Net().cuda().half()
        a = O.RAdam(net.parameters())
        b = NAdam(params=net.parameters(), eps=1e-9)
        c = O.Adamax(net.parameters(), 0.002, (0.9, 0.999), 1e-8)
    """) == [8, 9, 10]


def test_to_float16_through_a_dtype_variable_and_a_params_variable():
    assert lines("""
        import torch
        def build(device):
            dtype = torch.float16
            model = torch.nn.Linear(4, 4)
            model.to(device, dtype)
            params = [p for p in model.parameters() if p.requires_grad]
            return torch.optim.AdamW(params, weight_decay=0.1)
    """) == [8]


def test_self_attribute_converted_in_another_method():
    assert lines("""
        import torch
        class Trainer:
            def __init__(self):
                self.model = torch.nn.Linear(4, 4)
                self.model.half()
            def configure(self):
                return torch.optim.Adam(self.model.parameters())
    """) == [8]


def test_representable_or_unknown_eps_is_silent():
    assert lines("""
        import torch
        def build(eps):
            model = torch.nn.Linear(4, 4).half()
            a = torch.optim.Adam(model.parameters(), eps=1e-4)
            b = torch.optim.Adam(model.parameters(), eps=1e-7)
            c = torch.optim.Adam(model.parameters(), eps=eps)
    """) == []


def test_bfloat16_sgd_and_tensor_half_are_silent():
    assert lines("""
        import torch
        model = torch.nn.Linear(4, 4).to(torch.bfloat16)
        other = torch.nn.Linear(4, 4).half()
        x = torch.randn(3).half()
        a = torch.optim.Adam(model.parameters())
        b = torch.optim.SGD(other.parameters(), lr=0.1)
    """) == []


def test_half_after_the_optimizer_or_elsewhere_is_silent():
    assert lines("""
        import torch
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.Adam(model.parameters())
        model.half()
        def export(m):
            m.half()
        def train():
            net = torch.nn.Linear(4, 4)
            return torch.optim.Adam(net.parameters())
        def infer():
            net = torch.nn.Linear(4, 4)
            net.half()
    """) == []


def test_non_torch_adam_is_silent():
    assert lines("""
        import optax
        import torch
        model = torch.nn.Linear(4, 4).half()
        opt = optax.adam(1e-3)
        from mylib import Adam
        opt2 = Adam(model.parameters())
    """) == []


def test_an_optimizer_handed_to_a_master_weights_wrapper_steps_float32():
    # kimiyoung/transformer-xl: ``model.half()``, ``optim.Adam(model.parameters())``, then apex's
    # ``FP16_Optimizer(optimizer)``, which steps float32 master copies of the parameters
    source = """
        import torch
        from apex.fp16_utils import FP16_Optimizer
        from apex import amp
        model = torch.nn.Linear(4, 4)
        model.half()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        {wrap}
    """
    assert lines(source.format(wrap="optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)")) == []
    assert lines(source.format(wrap="model, optimizer = amp.initialize(model, optimizer, opt_level='O2')")) == []
    assert lines(source.format(wrap="other = FP16_Optimizer(other_optimizer)")) == [7]
