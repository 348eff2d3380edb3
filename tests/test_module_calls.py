"""The shared dispatcher of module calls (harness/module_calls.py)."""

from contextlib import ExitStack

import pytest

torch = pytest.importorskip("torch")

from torch.nn.modules import module as torch_module  # noqa: E402

from torchgradlint.harness.module_calls import CALLS, ModuleCalls  # noqa: E402


def _net():
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(4, 1)))


def test_each_call_and_top_level_calls_are_told_apart():
    calls = ModuleCalls()
    each, top_pre, top_post = [], [], []
    net = _net()
    with ExitStack() as stack:
        calls.subscribe(stack, each_pre=lambda m, a: each.append(type(m).__name__))
        calls.subscribe(stack, top_pre=lambda m: top_pre.append(m), top_post=lambda m, a, o: top_post.append((m, o)))
        out = net(torch.randn(2, 3))
        net[0](torch.randn(2, 3))  # a submodule called on its own is a top-level call too
    assert each == ["Sequential", "Linear", "Sequential", "ReLU", "Linear", "Linear"]
    assert top_pre == [net, net[0]]
    assert [m for m, _ in top_post] == [net, net[0]]
    assert top_post[0][1] is out


def test_one_pair_of_global_hooks_for_all_subscribers_and_none_after():
    before_pre = len(torch_module._global_forward_pre_hooks)
    before_post = len(torch_module._global_forward_hooks)
    seen = []
    with ExitStack() as outer:
        CALLS.subscribe(outer, each_pre=lambda m, a: seen.append("a"))
        with ExitStack() as inner:
            CALLS.subscribe(inner, each_pre=lambda m, a: seen.append("b"), top_post=lambda m, a, o: seen.append("t"))
            assert len(torch_module._global_forward_pre_hooks) == before_pre + 1
            assert len(torch_module._global_forward_hooks) == before_post + 1
            torch.nn.Linear(2, 2)(torch.randn(1, 2))
        assert seen == ["a", "b", "t"]
        torch.nn.Linear(2, 2)(torch.randn(1, 2))  # the inner subscriber has left
        assert seen == ["a", "b", "t", "a"]
    assert len(torch_module._global_forward_pre_hooks) == before_pre
    assert len(torch_module._global_forward_hooks) == before_post


def test_depth_restarts_when_hooks_are_installed_again():
    calls = ModuleCalls()
    calls.depth = 3  # left over from a forward that raised under an earlier session
    tops = []
    with ExitStack() as stack:
        calls.subscribe(stack, top_post=lambda m, a, o: tops.append(m))
        layer = torch.nn.Linear(2, 2)
        layer(torch.randn(1, 2))
    assert tops == [layer]


def test_own_parameters_reads_the_table_and_skips_unset_entries():
    from torchgradlint.harness.probe_base import own_parameters

    layer = torch.nn.Linear(3, 2, bias=False)
    assert own_parameters(layer) == [layer.weight]
    net = _net()
    assert own_parameters(net) == []  # a container registers none itself
    assert own_parameters(net[0]) == list(net[0].parameters(recurse=False))

    class Duck:  # no parameter table: through parameters(recurse=False)
        def parameters(self, recurse=True):
            assert recurse is False
            return iter([layer.weight])

    assert own_parameters(Duck()) == [layer.weight]
