"""TGL101 loss-kept-with-graph on short snippets the fixtures do not cover."""

import textwrap

import pytest

from torchgradlint.engine import lint_source
from torchgradlint.rules.loss_kept_with_graph import LossKeptWithGraph

from rule_snippets import SIMPLE_LOSS_COMPUTE


def diags(src: str):
    return [d for d in lint_source(textwrap.dedent(src), "x.py", [LossKeptWithGraph]).diagnostics
            if d.code == "TGL101"]


def lines(src: str) -> list[int]:
    """Lines of the TGL101 findings in ``src``."""
    return [d.line for d in diags(src)]


LOOP = """
import torch
from torch import nn
model = nn.Linear(4, 1)
criterion = nn.MSELoss()
{init}
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    {store}
{after}
"""


def loop(store: str, init: str = "losses = []", after: str = "") -> list[int]:
    return lines(LOOP.format(store=store, init=init, after=after))


def test_append_extend_and_accumulators_are_flagged():
    assert loop("losses.append(loss)") == [10]
    assert loop("losses.extend([loss, loss * 2])") == [10]
    assert loop("losses += [loss]") == [10]
    assert loop("total += loss", init="total = 0.0") == [10]
    assert loop("total = total + loss", init="total = 0.0") == [10]
    assert loop("total = loss + total", init="total = 0.0") == [10]
    assert loop("losses.append(loss.cpu())") == [10]


def test_detached_values_are_silent():
    for store in ("losses.append(loss.item())", "losses.append(loss.detach())", "losses.append(float(loss))",
                  "losses.append(loss.detach().cpu())", "losses.append(loss.data)"):
        assert loop(store) == [], store
    assert loop("total += loss.item() * x.size(0)", init="total = 0.0") == []
    assert loop("correct += (model(x).argmax(1) == y).sum()", init="correct = 0") == []


def test_container_bound_inside_the_loop_is_silent():
    assert lines("""
        import torch
        for x, y in loader:
            parts = []
            loss = model(x).sum()
            loss.backward()
            parts.append(loss)
        """) == []


def test_dict_with_loop_key_is_flagged_constant_key_is_silent():
    assert loop("hist[key] = loss", init="hist = {}\nkey = 'train'") == []  # key never changes
    assert lines("""
        import torch
        hist = {}
        for step in range(10):
            loss = model(x).sum()
            loss.backward()
            hist[step] = loss
            hist["last"] = loss
        """) == [7]


def test_later_backpropagated_on_purpose_is_silent():
    assert loop("losses.append(loss)", after="torch.stack(losses).sum().backward()") == []
    assert loop("losses.append(loss)", after="sum(losses).backward()") == []
    assert loop("total = total + loss", init="total = 0", after="(total / 4).backward()") == []


def test_storing_under_no_grad_is_silent():
    assert loop("with torch.no_grad():\n        losses.append(loss)") == []
    assert lines("""
        import torch
        @torch.no_grad()
        def evaluate(model, loader):
            outs = []
            for x in loader:
                outs.append(model(x))
            print(len(outs))
        """) == []


def test_unknown_grad_mode_needs_a_backward_in_scope():
    src = """
        import torch
        def run(model, loader):
            losses = []
            for x in loader:
                loss = model(x).mean()
                {bw}
                losses.append(loss)
            print(len(losses))
        """
    assert lines(src.format(bw="loss.backward()")) == [8]
    assert lines(src.format(bw="pass")) == []


def test_self_attribute_accumulator_is_flagged():
    assert lines("""
        import torch
        from torch import nn
        class Trainer:
            def __init__(self):
                self.history = []
                self.model = nn.Linear(2, 2)
            def step(self, x):
                loss = self.model(x).sum()
                loss.backward()
                self.history.append(loss)
        """) == [11]


def test_returned_container_backpropagated_by_caller_is_silent():
    assert lines("""
        import torch
        def chunk_loss(model, xs):
            total = 0.0
            for x in xs:
                total = total + model(x).sum()
            return total
        def main():
            loss = chunk_loss(model, xs)
            loss.backward()
        """) == []


def test_argmax_predictions_are_silent():
    assert loop("losses.append(model(x).argmax(1))") == []


def test_fix_replaces_stored_scalar_loss_with_item():
    src = LOOP.format(store="losses.append(loss)", init="losses = []", after="print(sum(losses) / len(losses))")
    (d,) = diags(src)
    assert d.fix is not None and d.fix.replacement == "loss.item()" and d.fix.safe
    (d,) = diags(LOOP.format(store="total += loss", init="total = 0.0", after="print(total)"))
    assert d.fix is not None and d.fix.replacement == "loss.item()"


def test_no_fix_when_ambiguous():
    # used as a tensor later: floats would break torch.stack
    (d,) = diags(LOOP.format(store="losses.append(loss)", init="losses = []",
                             after="print(torch.stack(losses).mean())"))
    assert d.fix is None
    # total.item() would break on a float
    (d,) = diags(LOOP.format(store="total += loss", init="total = 0.0", after="print(total.item())"))
    assert d.fix is None
    # not known to be a scalar loss
    (d,) = diags(LOOP.format(store="losses.append(model(x))", init="losses = []", after=""))
    assert d.fix is None


def test_rebound_to_item_after_backward_is_silent():
    # allennlp find_learning_rate: the name is rebound to a float before it is stored
    assert lines("""
        import torch
        def search(trainer, batches):
            losses = []
            for batch in batches:
                loss = trainer.batch_outputs(batch)["loss"]
                loss.backward()
                loss = loss.detach().cpu().item()
                losses.append(loss)
            return losses
        """) == []


def test_loop_over_modules_is_silent():
    assert lines("""
        import torch
        def predict(models, x):
            outs = []
            for model in models:
                outs.append(model(x))
            return torch.stack(outs).mean(0)
        def main():
            print(predict(models, x))
        """) == []


# A loss backpropagated through a value derived from it (``gen_loss = loss + aux``) has had its saved
# tensors freed like one backpropagated itself; one cut from it (``loss.detach() + aux``) has not.
DERIVED = """
import torch
def train(model, loader, opt, scaler):
    total = 0
    history = []
    for x in loader:
        loss = model(x).mean()
        aux = model(x).pow(2)
        gen_loss = {combined}
        gen_loss = gen_loss / 4
        scaler.scale(gen_loss).backward()
        opt.step()
        opt.zero_grad()
        total += loss
        history.append(aux)
    return total
"""


def test_a_loss_backpropagated_through_a_derived_value_keeps_only_its_graph():
    found = {d.line: d.message for d in diags(DERIVED.format(combined="loss + aux"))}
    # ``total`` is returned, but its losses can never be backpropagated again: reported
    assert sorted(found) == [14, 15]
    assert all("its autograd graph" in m and "every activation" not in m for m in found.values())


def test_a_loss_cut_from_the_backpropagated_value_keeps_its_activations():
    found = {d.line: d.message for d in diags(DERIVED.format(combined="loss.detach() + aux"))}
    # the returned ``total`` may still be backpropagated by the caller: silent; ``aux`` was freed
    assert sorted(found) == [15]
    assert "every activation" not in found[15]
    found = {d.line: d.message for d in diags(DERIVED.format(combined="loss.detach() + aux.detach()"))}
    assert "every activation saved for backward" in found[15]


HELPER_NAMED_LIKE_A_MODEL = """
import torch
from torch import nn


def train_model(net, train_loader, val_loader, optimizer, loss_module):
    val_scores = []
    for epoch in range(10):
        for imgs, labels in train_loader:
            optimizer.zero_grad()
            loss = loss_module(net(imgs), labels)
            loss.backward()
            optimizer.step()
        val_acc = test_model(net, val_loader, loss_module)
        val_scores.append(val_acc)


def test_model(net, data_loader, loss_module):
    net.eval()
    true_preds, count = 0.0, 0
    for imgs, labels in data_loader:
        with torch.no_grad():
            true_preds += (net(imgs).argmax(dim=-1) == labels).sum().item()
            count += labels.shape[0]
    {ret}
"""


def test_function_named_like_a_model_is_judged_by_what_it_returns():
    # Lightning's UvA-DL tutorials: ``val_acc = test_model(net, val_loader)``, a float accuracy,
    # was taken for the output of a module named ``test_model``
    assert lines(HELPER_NAMED_LIKE_A_MODEL.format(ret="return true_preds / count")) == []
    # the near miss: the same helper returning a loss with its graph is still reported
    assert lines(HELPER_NAMED_LIKE_A_MODEL.format(
        ret="return nn.functional.cross_entropy(net(imgs), labels)")) == [15]


FROM_SCRATCH = """
import torch


class MultilayerPerceptron:
    def __init__(self, num_features, num_classes):
        self.weight = torch.zeros(num_classes, num_features).normal_(0.0, 0.1){grad}
        self.bias = torch.zeros(num_classes)

    def forward(self, x):
        return torch.sigmoid(torch.mm(x, self.weight.t()) + self.bias)

    def backward(self, x, a, y):
        delta = 2.0 * (a - y) * a * (1.0 - a)
        return torch.mm(delta.t(), x) / y.size(0), torch.sum(delta, dim=0) / y.size(0)


def loss_func(targets, probas):
    return torch.mean(torch.mean((targets - probas) ** 2, dim=0))


def train(model, loader, learning_rate=0.1):
    minibatch_cost = []
    for features, targets in loader:
        a = model.forward(features)
        {update}
        curr_cost = loss_func(targets, a)
        minibatch_cost.append(curr_cost)
    print(len(minibatch_cost))
"""


def test_from_scratch_model_with_a_hand_written_backward_keeps_no_graph():
    # rasbt's STAT 453 notebooks: ``model.backward(x, a, y)`` is the course's own backward pass
    # (plain tensors, no autograd), and ``loss_func`` a function of the file: nothing holds a graph
    manual = ("dw, db = model.backward(features, a, targets)\n"
              "        model.weight -= learning_rate * dw\n        model.bias -= learning_rate * db")
    assert lines(FROM_SCRATCH.format(grad="", update=manual)) == []
    # the near miss: the same function of the file on a module's output, with autograd, keeps every
    # step's graph
    autograd = ("loss_func(targets, a).backward()\n"
                "        with torch.no_grad():\n            model.weight -= learning_rate * model.weight.grad")
    module = FROM_SCRATCH.format(grad="", update=autograd).replace(
        "a = model.forward(features)", "a = torch.sigmoid(net(features))").replace(
        "import torch\n", "import torch\nfrom torch import nn\nnet = nn.Linear(4, 2)\n")
    assert lines(module) == [32]


def test_three_positional_arguments_to_tensor_backward_still_backpropagate():
    # no hand-written ``backward(self, ...)`` in the file: ``loss.backward(g, True, False)`` is autograd's
    assert lines("""
    import torch
    from torch import nn
    model = nn.Linear(4, 1)
    losses = []
    for x in loader:
        loss = model(x).sum()
        loss.backward(None, True, False)
        losses.append(loss)
    """) == [9]


def test_an_instance_of_a_class_with_a_hand_written_backward_is_no_tensor():
    # dataflowr's backprop notebooks: ``My_add_bias.backward(grad)``, ``net.backward()`` are the course's own
    # layers (what reaches the call decides: the notebook later rebinds ``net`` to an ``nn.Sequential``)
    source = """
    import torch
    from torch import nn


    class add_bias:
        def __init__(self, b):
            self.b = b

        def forward(self, x):
            return x + self.b

        def backward(self, grad):
            self.grad = grad
            return grad

        def step(self, learning_rate):
            self.b -= learning_rate * self.grad


    layer = add_bias(torch.zeros(1))
    estimated_b = []
    for j in range(100):
        z_pred = layer.forward(xx[j])
        layer.backward(2 * (z_pred - zz[j]))
        layer.step(1e-2)
        estimated_b.append(layer.b)

    layer = nn.Linear(4, 1)  # a later cell rebinds the name to a torch layer
    model = nn.Linear(4, 1)
    losses = []
    for x in loader:
        loss = model(x).sum()
        loss.backward()
        losses.append(loss)
    """
    assert lines(source) == [35]


_COLLECT = """
import torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
{init}
for epoch in range(10):
    for x, y in loader:
        {reset}
        cost = (model(x) - y).pow(2).mean()
        opt.zero_grad()
        cost.backward()
        opt.step()
        collect['lr'].append(0.1)
        collect['cost'].append({stored})
"""


def test_list_held_in_a_dict_under_a_constant_key_is_a_store():
    # rasbt/deeplearning-models cyclical-learning-rate: ``collect['cost'].append(cost)`` every batch
    found = diags(_COLLECT.format(init="collect = {'lr': [], 'cost': []}", reset="pass", stored="cost"))
    assert [d.line for d in found] == [14] and "`collect['cost']`" in found[0].message
    assert lines(_COLLECT.format(init="collect = {'lr': [], 'cost': []}", reset="pass", stored="cost.item()")) == []
    # rebuilt every iteration: bounded
    assert lines(_COLLECT.format(init="", reset="collect = {'lr': [], 'cost': []}", stored="cost")) == []


_MICRO_BATCHES = """
import torch

def train(model, optimizer, loader, loss_fn):
    {outer}
    for data, targets in loader:
        {inner}
        optimizer.zero_grad()
        for chunk, target in zip(data.chunk(4), targets.chunk(4)):
            out = model(chunk)
            outputs.append(out)
            loss = loss_fn(out, target)
            loss.backward()
        {step}
"""


def test_micro_batch_outputs_kept_for_one_optimizer_step_are_not_reported():
    """hysts/pytorch_image_classification: ``outputs = []`` per batch, each chunk's output stored and
    its loss backpropagated, one ``optimizer.step()`` after the chunks: nothing outlives the step."""
    assert lines(_MICRO_BATCHES.format(outer="", inner="outputs = []", step="optimizer.step()")) == []
    # the list outlives every step (bound before the batch loop): reported
    assert lines(_MICRO_BATCHES.format(outer="outputs = []", inner="pass", step="optimizer.step()")) == [11]
    # no optimizer step after the chunks: no evidence that the list is one step's
    assert lines(_MICRO_BATCHES.format(outer="", inner="outputs = []", step="pass")) == [11]


def test_accumulated_micro_batch_losses_of_one_step_are_not_reported():
    """davidtvs/pytorch-lr-finder's ``_train_batch``: ``total_loss += loss`` over the accumulation
    steps of one call, each loss backpropagated, then ``optimizer.step()``."""
    assert lines("""
        import torch

        def train_batch(model, optimizer, batches, accumulation_steps):
            total_loss = None
            optimizer.zero_grad()
            for i in range(accumulation_steps):
                x, y = next(batches)
                loss = torch.nn.functional.mse_loss(model(x), y) / accumulation_steps
                loss.backward()
                if total_loss is None:
                    total_loss = loss
                else:
                    total_loss += loss
            optimizer.step()
            return total_loss.item()
        """) == []


def test_a_method_no_tensor_has_is_another_objects():
    # IBM/pytorch-seq2seq: ``loss = self.loss`` (a loss accumulator whose ``backward()`` the trainer
    # calls), ``return loss.get_loss()`` (a float), summed per batch
    source = """
    import torch

    class Trainer:
        def _train_batch(self, x, y, model):
            loss = self.loss
            loss.reset()
            loss.eval_batch(model(x), y)
            model.zero_grad()
            loss.backward()
            self.optimizer.step()
            return loss.{method}

        def train(self, data, model):
            total = 0
            for x, y in data:
                step_loss = self._train_batch(x, y, model)
                total += step_loss
            return total
    """
    assert lines(source.format(method="get_loss()")) == []
    plain = """
    import torch
    model = torch.nn.Linear(2, 1)
    criterion = torch.nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def train_batch(x, y):
        opt.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        opt.step()
        return loss{method}

    total = 0
    for x, y in data:
        total += train_batch(x, y)
    """
    assert lines(plain.format(method=".float()")) == [16]  # a tensor method keeps the graph
    assert lines(plain.format(method=".get_loss()")) == []  # no tensor has it: another object's


def test_an_element_of_a_modules_tuple_is_read_from_its_forward_only_when_every_return_is_a_tuple():
    # PyG's top-k pooling examples: ``ratio = out.size(0) / x.size(0)`` returned beside the output is a
    # float; big-sleep's forward returns ``out`` alone on one path and ``out, (l1, l2, l3)`` on the other
    source = """
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x, extra=True):
            out = self.fc(x)
            {early}
            return out, {second}

    net = Net()
    total = 0
    for x in batches:
        out, second = net(x)
        total += second
    """
    assert lines(source.format(early="", second="out.size(0) / x.size(0)")) == []
    assert lines(source.format(early="if not extra:\n                return out",
                               second="out.size(0) / x.size(0)")) == [20]
    assert lines(source.format(early="", second="(out.sum(), out.mean())")) == [19]


def test_a_backpropagated_loss_divided_for_the_epoch_mean_keeps_only_its_graph():
    # vit-pytorch's cats-and-dogs notebook: ``epoch_loss += loss / len(train_loader)`` after ``loss.backward()``
    found = diags("""
    import torch
    for data, label in train_loader:
        output = model(data)
        loss = criterion(output, label)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        epoch_loss += loss / len(train_loader)
    """)
    assert [d.line for d in found] == [9]
    text = found[0].message + " " + (found[0].detail or "")
    assert "every activation" not in text and "`(loss / len(train_loader)).item()`" in text


_SAMPLED_ACTION = """
import torch
from torch import nn
from torch.distributions import Normal


class Actor(nn.Module):
    def __init__(self):
        super().__init__()
        self.mu = nn.Linear(3, 1)

    def forward(self, state):
        dist = Normal(torch.tanh(self.mu(state)), 1.0)
        action = dist.{draw}()
        return action, dist


actor = Actor()
opt = torch.optim.SGD(actor.parameters(), lr=0.1)
actions = []
for state in states:
    action, dist = actor(state)
    actions.append(action)
    opt.zero_grad()
    actor.mu(state).sum().backward()
    opt.step()
"""


def test_a_distribution_sample_holds_no_graph_but_rsample_does():
    # MrSyee/pg-is-all-you-need's PPO: the actor returns ``Normal(mu, std).sample()``, drawn under no_grad
    assert lines(_SAMPLED_ACTION.format(draw="sample")) == []
    assert lines(_SAMPLED_ACTION.format(draw="rsample")) == [23]


_ACCUMULATION = """
import torch
from torch import nn
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
running_loss = 0
for idx, (x, y) in enumerate(loader):
    loss = ((model(x) - y) ** 2).mean()
    n = (y != -100).sum()
    {store}
    (loss / accum).backward()
    if (idx + 1) % accum == 0:
        optimizer.step()
        optimizer.zero_grad()
        print(running_loss.item())
        {reset}
"""


def test_a_running_sum_reset_after_each_optimizer_step_lives_one_step():
    # torchtune's recipes: ``running_loss += current_loss`` per micro-batch, reset after the step
    assert lines(_ACCUMULATION.format(store="running_loss += loss * n", reset="running_loss = 0")) == []
    assert lines(_ACCUMULATION.format(store="running_loss += loss", reset="running_loss = 0")) == []
    # never reset: every step's graph stays attached to the sum
    assert lines(_ACCUMULATION.format(store="running_loss += loss", reset="pass")) == [10]
    # a value no backward frees (a second forward's output) keeps its activations for the window
    assert lines(_ACCUMULATION.format(store="running_loss += model(x).sum()", reset="running_loss = 0")) == [10]


_SELECTED = """
import torch
from torch import nn

actor = nn.Linear(3, 1)
opt = torch.optim.SGD(actor.parameters(), lr=0.1)
actions = []
for state in states:
    mean = actor(state)
    action = torch.normal(mean.detach(), 1.0)
    selected = mean if is_test else action
    if {guard}:
        actions.append(selected)
    opt.zero_grad()
    mean.sum().backward()
    opt.step()
"""


def test_a_conditional_value_read_under_the_same_condition_takes_that_branch():
    # MrSyee's PPO: ``selected_action = dist.mean if self.is_test else action``, stored under ``if not
    # self.is_test``: only the sampled action (no graph) is ever stored
    assert lines(_SELECTED.format(guard="not is_test")) == []
    assert lines(_SELECTED.format(guard="is_test")) == [13]  # the mean, with its graph
    assert lines(_SELECTED.format(guard="ready")) == [13]  # another condition: either value


def test_helpers_named_after_a_numpy_conversion_hold_no_graph():
    # rlkit's ``ptu.get_numpy(t)`` (``t.to('cpu').detach().numpy()``), ``to_np``, ``as_numpy``
    src = """
    import torch
    import utils as ptu
    from utils import to_np, as_numpy, prepare
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    stats = []
    for x, y in loader:
        loss = ((model(x) - y) ** 2).mean()
        loss.backward(retain_graph=True)
        optimizer.step()
        stats.append({call})
    """
    for call in ("ptu.get_numpy(loss)", "to_np(loss)", "as_numpy(loss)"):
        assert lines(src.format(call=call)) == [], call
    assert lines(src.format(call="prepare(loss)")) == [12]


UNROLL = """
import torch

def rnn_loop(char_rnn, batch_ix):
    hid_state = char_rnn.initial_state(batch_ix.size(0))
    logits_seq = []
    for x_t in {iterable}:
        hid_state, logits = char_rnn(x_t, hid_state)
        logits_seq.append(logits)
    return torch.stack(logits_seq, dim=1)

logits_seq = rnn_loop(CharRNNCell(), batch_ix)
print(logits_seq.size())
opt = torch.optim.Adam(char_rnn.parameters())
"""


def test_an_rnn_unrolled_over_the_positions_of_one_batch_is_one_forward():
    # hse-aml/intro-to-dl-pytorch week 5 (its training cell is an exercise that does not parse)
    assert lines(UNROLL.format(iterable="batch_ix.transpose(0, 1)")) == []
    assert lines(UNROLL.format(iterable="batch_ix.permute(1, 0)")) == []
    assert lines(UNROLL.format(iterable="train_loader")) == [9]  # each iteration a batch: kept across the data loop


CALLABLE_LOSS = """
import torch

""" + SIMPLE_LOSS_COMPUTE.replace("{reset}", "self.opt.zero_grad()") + """
def run_epoch(data_iter, model, loss_compute):
    total_loss = 0
    for i, batch in enumerate(data_iter):
        out = model.forward(batch.src, batch.trg)
        loss = loss_compute(out, batch.trg_y, batch.ntokens)
        total_loss += loss
    return total_loss

loss_compute = SimpleLossCompute(model.generator, criterion, optimizer)
run_epoch(train_iter, model, loss_compute)
"""


def test_a_callable_instance_handed_to_the_loop_is_judged_by_its_call_method():
    # datawhalechina/dive-into-cv-pytorch (the annotated Transformer's run_epoch): __call__ returns a float
    assert lines(CALLABLE_LOSS.format(returned="loss.item() * norm")) == []
    assert lines(CALLABLE_LOSS.format(returned="loss * norm")) == [24]


def test_a_stored_attribute_loss_backpropagated_by_accelerate_keeps_graph_nodes_only():
    # Fafa-DL/Lhy_Machine_Learning's 2023 HW7: ``train_loss += output.loss``, then
    # ``accelerator.backward(output.loss)`` frees the saved activations of that very loss
    src = """
import torch
for data in train_loader:
    output = model(input_ids=data[0], start_positions=data[3])
    train_loss += output.loss
    accelerator.backward({target})
    optimizer.step()
    optimizer.zero_grad()
"""
    [d] = diags(src.format(target="output.loss"))
    assert "every activation" not in d.message
    [d] = diags(src.format(target="other.loss"))
    assert "every activation" in d.message


def test_an_accuracy_unpacked_from_a_forward_the_file_cannot_see_is_no_evidence():
    # dmlc/dgl's JT-VAE example: ``loss, kl_div, wacc, tacc, sacc, dacc = model(batch, beta)``
    src = """
import torch
from jtnn import JTNNVAE
model = JTNNVAE(vocab)
optimizer = torch.optim.Adam(model.parameters())
for batch in dataloader:
    model.zero_grad()
    loss, kl_div, wacc, tacc = model(batch, beta)
    loss.backward()
    optimizer.step()
    word_acc += wacc
    topo_acc += tacc
    kl_sum += kl_div
"""
    assert lines(src) == [13]  # the KL term is a loss; the accuracies are counts


def test_a_loss_a_helper_backpropagated_before_returning_it_keeps_graph_nodes_only():
    # dmlc/dgl's line-graph example: ``loss = step(...)`` runs ``loss.backward()`` and returns the loss
    src = """
import torch

def step(model, batch, optimizer):
    loss = model(batch).pow(2).mean()
    optimizer.zero_grad()
    loss.backward({retain})
    optimizer.step()
    return loss

for epoch in range(10):
    total_loss = 0
    for batch in train_loader:
        loss = step(model, batch, optimizer)
        total_loss += loss
"""
    [d] = diags(src.format(retain=""))
    assert d.line == 15 and "every activation" not in d.message
    [d] = diags(src.format(retain="retain_graph=True"))
    assert "every activation" in d.message


ROLLOUT = """
import torch
from torch.distributions import Categorical


def train(model, env, optimizer, steps):
    state = env.reset()
    for episode in range(100):
        values = []
        log_probs = []
        for _ in range(steps):
            logits, value = model(state)
            values.append(value)
            dist = Categorical(logits=logits)
            action = dist.sample()
            log_probs.append(dist.log_prob(action))
            state = env.step(action)
        {after}
        loss = model.update(values, log_probs)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def rollout(after: str) -> str:
    return ROLLOUT.replace("{after}", textwrap.indent(textwrap.dedent(after), " " * 8).strip())


def test_rollout_lists_detached_after_the_loop_are_flagged():
    # PPO's rollout with grad enabled (Super-mario-bros-PPO): every step's graph lives until the detach
    src = rollout("""
        values = torch.cat(values).detach()
        log_probs = [lp.detach() for lp in log_probs]
        n = len(values)
    """)
    assert lines(src) == [13, 16]
    assert diags(src)[0].message.endswith("with its graph and saved activations until the loop ends")


def test_rollout_lists_read_with_their_graphs_are_silent():
    # REINFORCE backpropagates through the stored log-probabilities; an RNN unrolled by hand
    # returns its outputs; a list also read whole keeps its graphs on purpose
    assert lines(rollout("""
        values = torch.cat(values)
        log_probs = torch.cat(log_probs).detach()
        log_probs = log_probs + torch.stack(log_probs).sum()
    """).replace("log_probs = log_probs +", "values = values +")) == [16]
    assert lines(rollout("""
        values = torch.cat(values).detach()
        log_probs = torch.stack(log_probs)
    """)) == [13]
    assert lines(rollout("""
        for v in values:
            print(v.detach())
        log_probs = torch.stack(log_probs).detach()
    """)) == [16]


def test_rollout_under_no_grad_is_silent():
    src = rollout("""
        values = torch.cat(values).detach()
        log_probs = torch.cat(log_probs).detach()
    """).replace("            logits, value = model(state)",
                 "            with torch.no_grad():\n                logits, value = model(state)")
    assert lines(src) == []


def test_distribution_log_prob_holds_the_graph_of_its_parameters():
    # REINFORCE's update keeps it: the stored log-probabilities are backpropagated
    src = """
    import torch
    from torch.distributions import Categorical

    def run(policy, env, optimizer):
        for episode in range(100):
            log_probs = []
            for t in range(200):
                dist = Categorical(policy(env.state()))
                action = dist.sample()
                log_probs.append(dist.log_prob(action))
                env.step(action)
            loss = -torch.stack(log_probs).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            history = []
            for t in range(200):
                dist = Categorical(policy(env.state()))
                history.append(dist.entropy())
            mean_entropy = torch.stack(history).mean().item()
    """
    assert lines(src) == [20]


BUFFER = """
import torch
import torch.nn.functional as F


def run(model, loader, optimizer, labels, n):
    for epoch in range(10):
        train_logits = {buffer}
        for batch in loader:
            {store}
            loss = F.cross_entropy(logits, labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(train_logits.argmax(1))
"""


@pytest.mark.parametrize("buffer, store, expected", [
    # ZZy979's MAGNN: each batch's logits copied into an epoch buffer with their graph
    ("torch.zeros(n, 4)", "train_logits[batch] = logits = model(batch)", [10]),
    ("torch.zeros(n, 4).to('cuda')", "logits = model(batch); train_logits[batch] = logits", [10]),
    ("torch.zeros(n, 4)", "train_logits[batch] = logits = model(batch).detach()", []),
    ("torch.zeros(n, 4)", "logits = model(batch); train_logits[0] = logits", []),  # one slot, overwritten
    ("torch.zeros(n, 4, requires_grad=True)", "train_logits[batch] = logits = model(batch)", []),
])
def test_a_buffer_tensor_filled_with_graph_attached_values(buffer, store, expected):
    src = BUFFER.format(buffer=buffer, store=store)
    assert lines(src) == expected
    if expected:
        assert diags(src)[0].message.endswith("with its autograd graph")  # the loss's backward freed the rest


def test_a_hand_written_backward_in_a_file_that_never_spells_torch_is_no_autograd():
    # atiarmn's course: numpy layers imported from other files, ``layers[i].backward(grad)``
    src = """
    import numpy as np
    import FullyConnectedLayer, SquaredError

    layers = [FullyConnectedLayer.FullyConnectedLayer(4, 1), SquaredError.SquaredError()]
    log = []
    for epoch in range(100):
        yhat = layers[0].forward(X)
        loss = layers[-1].eval(Y, yhat)
        log.append(loss)
        grad = layers[-1].gradient(Y, yhat)
        grad = layers[0].backward(grad)
    """
    assert lines(src) == []
    # a helper module that never imports torch but trains with it (its callers pass torch objects)
    assert lines("""
    def train_epoch(model, loader, optimizer, criterion):
        total = 0
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss
        return total / len(loader)

    train_epoch(net, loader, opt, crit)
    """) == [9]
