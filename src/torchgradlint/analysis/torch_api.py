"""The torch vocabulary the analysis layer shares: one table per fact.

Every rule and analysis module asks these tables instead of keeping its own
copy (a second copy drifts). Names are compared after alias resolution
(:mod:`.names`), so ``torch.nn.functional.cross_entropy`` means
``F.cross_entropy`` whatever ``F`` was imported as.

PyTorch docs: ``torch`` (tensor creation ops), ``torch.Tensor`` (methods),
``torch.nn`` (loss modules, layers), ``torch.nn.functional`` (loss functions),
"Autograd mechanics" (what keeps or drops a graph).
"""

from __future__ import annotations

import re

# Tensor creation ops (``torch.<name>``): a fresh tensor with no graph, a leaf
# that requires grad with ``requires_grad=True``.
FACTORIES = frozenset({
    "tensor", "as_tensor", "from_numpy", "zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm",
    "arange", "linspace", "logspace", "eye", "zeros_like", "ones_like", "empty_like", "full_like", "rand_like",
    "randn_like", "randint_like", "normal", "bernoulli", "multinomial", "Tensor", "FloatTensor", "LongTensor",
    "manual_seed", "device", "Generator",
})

# ``torch.<name>`` functions that are differentiable in their tensor arguments.
DIFFERENTIABLE = frozenset({
    "stack", "cat", "concat", "hstack", "vstack", "sum", "mean", "matmul", "mm", "bmm", "exp", "log", "sqrt", "abs",
    "pow", "clamp", "tanh", "sigmoid", "relu", "softmax", "log_softmax", "norm", "cdist", "einsum", "where",
    "maximum", "minimum", "square", "flatten", "reshape", "squeeze", "unsqueeze", "add", "mul", "sub", "div", "std",
    "var", "logsumexp", "prod", "dot", "outer", "sin", "cos", "max", "min", "gather", "index_select", "masked_select",
    "transpose", "permute", "chunk", "split", "narrow", "cumsum", "diagonal", "trace", "tril", "triu", "clip",
    "real", "imag", "lerp", "addmm", "baddbmm", "mv", "kron", "roll", "flip", "repeat_interleave", "squeeze",
})

# ``torch.nn.functional`` functions that are not differentiable.
FUNCTIONAL_NOT_DIFFERENTIABLE = frozenset({"one_hot"})

# ``torch.nn.functional`` loss functions (any ``*_loss`` counts too).
LOSS_FUNCTIONALS = frozenset({
    "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "kl_div", "poisson_nll_loss", "gaussian_nll_loss", "cosine_embedding_loss",
    "hinge_embedding_loss", "margin_ranking_loss", "multi_margin_loss", "multilabel_margin_loss",
    "multilabel_soft_margin_loss", "soft_margin_loss", "triplet_margin_loss", "ctc_loss",
    "triplet_margin_with_distance_loss",
})

# Tensor methods whose result stays in the graph of their receiver.
GRAPH_KEEPING_METHODS = frozenset({
    "mean", "sum", "view", "view_as", "reshape", "reshape_as", "to", "cpu", "cuda", "float", "double", "half",
    "bfloat16", "squeeze", "unsqueeze", "flatten", "abs", "pow", "sqrt", "exp", "log", "clone", "contiguous",
    "norm", "mul", "add", "sub", "div", "neg", "clamp", "permute", "transpose", "t", "expand", "expand_as",
    "repeat", "softmax", "log_softmax", "sigmoid", "tanh", "relu", "matmul", "mm", "bmm", "type", "type_as",
    "select", "narrow", "prod", "std", "var", "square", "logsumexp", "masked_fill", "gather", "index_select",
    "unflatten", "movedim", "sin", "cos", "mul_", "add_", "div_", "sub_", "max", "min", "diagonal", "chunk",
    "split", "cumsum", "squeeze_", "unsqueeze_", "clamp_", "masked_fill_", "log1p", "expm1", "rsqrt",
    "reciprocal", "sign", "floor", "ceil", "round", "trunc", "amax", "amin", "logit", "roll", "flip",
})
# Methods that may return their receiver unchanged (``x.to(dev)`` when ``x``
# is already there): under no_grad they do not prove a detached result.
MAY_RETURN_SELF = frozenset({"to", "cpu", "cuda", "float", "double", "half", "bfloat16", "type", "type_as",
                             "contiguous", "detach_", "requires_grad_"})
# Methods whose result holds no graph whatever the receiver.
DETACHING_METHODS = frozenset({"item", "tolist", "detach", "numpy"})
# ``torch.distributions.Distribution.sample`` draws under ``torch.no_grad()`` (``rsample`` is the
# reparameterised, differentiable draw): its result holds no graph.
DISTRIBUTION_SAMPLE_METHODS = frozenset({"sample", "sample_n"})
# Methods of a ``torch.distributions`` object computed from its parameters (differentiable in them):
# ``Categorical(logits=l).log_prob(a)`` holds the graph of ``l``.
DISTRIBUTION_GRAPH_METHODS = frozenset({"log_prob", "entropy", "rsample", "cdf", "icdf", "perplexity"})
# In-place detach cuts the path too.
DETACH_IN_PLACE = frozenset({"detach_"})
# Builtins whose result is a plain Python value.
DETACHING_BUILTINS = frozenset({"float", "int", "bool", "len", "round", "str", "repr"})
# Methods whose result is graph-free whatever the receiver (module and container bookkeeping).
OBJECT_METHODS = frozenset({"parameters", "named_parameters", "buffers", "named_buffers", "children",
                            "modules", "state_dict", "size", "dim", "numel", "keys", "items", "argmax", "argmin",
                            "nelement", "element_size", "is_contiguous", "data_ptr", "get_device", "ndimension"})

# A loss module: ``torch.nn.<Name>Loss``. A loss-like name for values and callees.
LOSS_NAME = re.compile(r"^(criterion|loss_fn|loss_func|loss_function|lossfn|objective)(_\w+)?$"
                       r"|^\w+_(criterion|loss_fn)$")
# Names of values that a script keeps as loss terms (``imput_mse``, ``kl``, ``nll``...).
LOSS_VALUE_NAME = re.compile(r"(^|_)(loss|losses|mse|nll|kld|kl|bce|ce|elbo)(_|\d|$)", re.I)
# Names that read as an evaluation metric (``acc``, ``word_acc``, ``wacc``, ``n_correct``, ``top1``):
# counts and ratios of argmax or threshold comparisons, which hold no graph.
METRIC_VALUE_NAME = re.compile(r"((^|_)(accs?|accuracy|correct|precision|recall|f1|auc|top[15])(_|\d|$)|acc$)",
                               re.I)
# Callees named like a loss function (``GaussianNegLogLik``, ``mse``, ``my_loss``).
LOSS_CALLEE_NAME = re.compile(r"(loss|mse|nll|neglog|kld|kl_div|elbo|cross_entropy)", re.I)

# Grad-mode context managers (see :mod:`.grad_mode`).
INFERENCE_MODE = "torch.inference_mode"

# GradScaler methods that pass their tensor argument through (``scaler.scale(loss)``).
SCALER_PASS_THROUGH = frozenset({"scale"})

# Methods that run a module's forward (``model.generate(...)`` runs the decoder forward).
FORWARD_METHODS = frozenset({"forward", "generate", "predict", "predict_step", "sample"})

# Layers whose forward depends on ``training`` (dropout, batch norm and the
# layers that contain them).
MODE_LAYER = re.compile(r"Dropout|BatchNorm|SyncBatchNorm|Transformer|MultiheadAttention|RReLU|InstanceNorm")

# Library model classes whose forward does not depend on ``training`` as
# they are built by default (GroupNorm/LayerNorm/RMSNorm, every dropout
# probability 0.0): diffusers' VAE and UNets; transformers' BLIP (its text and
# vision configs default every dropout to 0.0) and the Llama-family decoders
# (``attention_dropout=0.0``, no other dropout); MONAI's diffusion UNet and
# ControlNet; torch_geometric's MetaPath2Vec and Node2Vec. A keyword naming a
# dropout rate (``dropout=``, ``dropout_cattn=``) other than 0, or ``**kwargs``,
# makes a constructor call mode-sensitive again; a PEFT wrapper
# (``get_peft_model``: LoRA dropout) is another module, judged on its own.
MODE_FREE_LIBRARY_CLASSES = frozenset({
    "diffusers.AutoencoderKL", "diffusers.models.AutoencoderKL",
    "diffusers.models.autoencoders.autoencoder_kl.AutoencoderKL",
    "diffusers.UNet2DConditionModel", "diffusers.models.UNet2DConditionModel",
    "diffusers.models.unets.unet_2d_condition.UNet2DConditionModel",
    "diffusers.UNet2DModel", "diffusers.models.UNet2DModel", "diffusers.models.unets.unet_2d.UNet2DModel",
    # MONAI's diffusion networks: group norm, and dropout only in cross-attention (``dropout_cattn=0.0``)
    *(f"monai.networks.nets.{path}{name}" for path, name in (
        ("", "DiffusionModelUNet"), ("diffusion_model_unet.", "DiffusionModelUNet"),
        ("", "ControlNet"), ("controlnet.", "ControlNet"))),
    # torch_geometric's shallow embeddings: a lookup table and a sampler, no layer that depends on the mode
    *(f"torch_geometric.nn.{path}{name}" for path, name in (
        ("", "MetaPath2Vec"), ("models.", "MetaPath2Vec"), ("models.metapath2vec.", "MetaPath2Vec"),
        ("", "Node2Vec"), ("models.", "Node2Vec"), ("models.node2vec.", "Node2Vec"))),
    # DGL's graph convolutions without a dropout or normalisation argument, and its sparse embeddings
    *(f"dgl.nn.{path}{name}" for path in ("", "pytorch.", "pytorch.conv.")
      for name in ("GraphConv", "ChebConv", "TAGConv")),
    "dgl.distributed.DistEmbedding", "dgl.nn.NodeEmbedding", "dgl.nn.pytorch.NodeEmbedding",
    "dgl.nn.pytorch.sparse_emb.NodeEmbedding",
    *(f"transformers.{name}" for name in (
        "BlipForConditionalGeneration", "BlipForQuestionAnswering", "BlipModel",
        "LlamaForCausalLM", "LlamaModel", "MistralForCausalLM", "MistralModel",
        "Qwen2ForCausalLM", "Qwen2Model", "GemmaForCausalLM", "GemmaModel")),
})
# torch_geometric's ``BasicGNN`` models, ``(in_channels, hidden_channels, num_layers,
# out_channels=None, dropout=0.0, act, act_first, act_kwargs, norm=None, ...)``: no
# dropout and no normalisation unless the constructor call gives them (the position of
# ``dropout``; a ``dropout`` other than 0, a ``norm`` other than ``None`` or ``**kwargs``
# make a call mode-sensitive).
MODE_FREE_UNLESS_GIVEN = {f"torch_geometric.nn.{path}{name}": 4
                          for path in ("", "models.", "models.basic_gnn.")
                          for name in ("GCN", "GraphSAGE", "GIN", "GAT", "PNA", "EdgeCNN")}
# Opacus's differentially private RNNs, ``(input_size, hidden_size, num_layers=1, bias=True,
# batch_first=False, dropout=0, ...)`` like ``nn.LSTM``: dropout only when given.
MODE_FREE_UNLESS_GIVEN.update({f"opacus.layers.{path}{name}": 5 for path in ("", "dp_rnn.")
                               for name in ("DPLSTM", "DPGRU", "DPRNN")})
# MONAI's segmentation networks, mode-free as built by default (instance norm without running
# statistics, every dropout rate 0.0) and mode-dependent when given a batch norm or a dropout rate:
# ``UNet(spatial_dims, in_channels, out_channels, channels, strides, kernel_size, up_kernel_size,
# num_res_units, act, norm=Norm.INSTANCE, dropout=0.0)``, ``BasicUNet(spatial_dims, in_channels,
# out_channels, features, act, norm=("instance", ...), bias, dropout=0.0)``, ``SwinUNETR(img_size,
# in_channels, out_channels, depths, num_heads, feature_size, norm_name="instance", drop_rate=0.0,
# attn_drop_rate=0.0, dropout_path_rate=0.0)`` (layer norm in its transformer), ``UNETR(in_channels,
# out_channels, img_size, feature_size, hidden_size, mlp_dim, num_heads, proj_type,
# norm_name="instance", conv_block, res_block, dropout_rate=0.0)``: each with the position of its norm
# argument (more positional arguments than that: not judged).
MONAI_NORM_CONFIGURED = {f"monai.networks.nets.{path}{name}": position
                         for name, position, module in (("UNet", 9, "unet"), ("BasicUNet", 5, "basic_unet"),
                                                        ("SwinUNETR", 6, "swin_unetr"), ("UNETR", 8, "unetr"))
                         for path in ("", f"{module}.")}
# PEFT's wrappers: ``get_peft_model(model, config)`` adds adapter layers to ``model``; their only
# mode-dependent layer is the adapter dropout a ``peft.*Config`` takes (``lora_dropout``,
# ``boft_dropout``, ``module_dropout``, ``rank_dropout``, ``vera_dropout``: all 0.0 by default).
PEFT_WRAPPERS = frozenset({"peft.get_peft_model", "peft.mapping.get_peft_model",
                           "peft.mapping_func.get_peft_model"})
# Methods that move or switch a module or tensor and return the same object (``Net().to(device).train()``;
# :func:`torchgradlint.analysis.model.unwrap` strips them).
RECEIVER_METHODS = frozenset({"to", "cuda", "cpu", "train", "eval", "float", "double", "half", "bfloat16",
                              "requires_grad_", "share_memory"})
# ``nn.Module`` methods that return the module itself (``nn.Linear(a, b).cuda()``): those, and two
# that only a module returns itself from (``Tensor.type()`` without a dtype gives a string).
MODULE_RETURNING_METHODS = RECEIVER_METHODS | {"type", "apply"}
# Class methods that build an instance of their class.
CLASS_FACTORIES = frozenset({"from_pretrained", "from_config", "from_single_file"})

# Helpers from other files named after a detaching call (``torch_item(x)``,
# ``to_numpy(t)``, ``tensor2float(l)``, rlkit's ``ptu.get_numpy(t)``): their result holds no graph.
DETACHING_CALLEE_NAME = re.compile(r"(^|[._])(torch_item|to_item|item|to_numpy|get_numpy|as_numpy|to_np|"
                                   r"tensor_to_numpy|tensor2numpy|tensor2np|"
                                   r"to_float|tensor2float|to_scalar|to_python)$")

# Wrappers whose forward is the wrapped module's own (``torch.compile(model)``,
# ``nn.DataParallel(Net())``): same layers, same mode, same output.
SAME_FORWARD_WRAPPERS = frozenset({"torch.compile", "torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                                   "torch.nn.parallel.DistributedDataParallel", "torch.jit.script"})

# Activation checkpointing: runs the given function's forward and returns its output.
CHECKPOINT = frozenset({"torch.utils.checkpoint.checkpoint", "torch.utils.checkpoint.checkpoint_sequential"})

# -- shared with the prefilter's premises (:mod:`torchgradlint.prefilter` matches their last names) --------

# ``torch.nn.functional`` dropouts: ``(input, p=0.5, training=True, inplace=False)`` (TGL203).
FUNCTIONAL_DROPOUTS = frozenset(f"torch.nn.functional.{n}" for n in (
    "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"))
# torch-level dropouts: ``(input, p, train)``, ``train`` required (TGL203).
TORCH_DROPOUTS = frozenset(f"torch.{n}" for n in (
    "dropout", "alpha_dropout", "feature_dropout", "feature_alpha_dropout"))
SDPA = "torch.nn.functional.scaled_dot_product_attention"
# ``torch.nn`` dropout modules, ``(p=0.5, inplace=False)``: one built and called at once inside a method
# (``nn.Dropout(0.25)(x)``) is a new module in training mode on every call (TGL203).
DROPOUT_MODULES = frozenset(f"torch.nn.{n}" for n in (
    "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout"))

# Probabilities and the losses that must not be fed them (TGL303): qualified name -> kind.
SOFTMAX, SIGMOID = "softmax", "sigmoid"
PROBABILITY_FUNCTIONS = {
    "torch.softmax": SOFTMAX, "torch.nn.functional.softmax": SOFTMAX, "torch.special.softmax": SOFTMAX,
    "torch.sigmoid": SIGMOID, "torch.nn.functional.sigmoid": SIGMOID, "torch.special.expit": SIGMOID,
}
PROBABILITY_MODULES = {"torch.nn.Softmax": SOFTMAX, "torch.nn.modules.activation.Softmax": SOFTMAX,
                       "torch.nn.Sigmoid": SIGMOID, "torch.nn.modules.activation.Sigmoid": SIGMOID}
CE, NLL, BCE_LOGITS, KL = "cross_entropy", "nll_loss", "bce_with_logits", "kl_div"
# Losses whose input is logits or log-probabilities (``kl_div``'s input is log-probabilities
# whatever ``log_target`` says of its target).
LOGIT_LOSS_FUNCTIONS = {"torch.nn.functional.cross_entropy": CE, "torch.nn.functional.nll_loss": NLL,
                        "torch.nn.functional.binary_cross_entropy_with_logits": BCE_LOGITS,
                        "torch.nn.functional.kl_div": KL}
LOGIT_LOSS_MODULES = {"torch.nn.CrossEntropyLoss": CE, "torch.nn.NLLLoss": NLL,
                      "torch.nn.BCEWithLogitsLoss": BCE_LOGITS, "torch.nn.KLDivLoss": KL,
                      "torch.nn.modules.loss.CrossEntropyLoss": CE, "torch.nn.modules.loss.NLLLoss": NLL,
                      "torch.nn.modules.loss.BCEWithLogitsLoss": BCE_LOGITS, "torch.nn.modules.loss.KLDivLoss": KL}

# Container methods that store a value (TGL101): method -> position of the stored argument.
STORE_METHODS = {"append": 0, "appendleft": 0, "insert": 1, "extend": 0}
# Concatenations whose result holds every input's graph (TGL101's ``x = torch.cat([x, v])``).
CONCAT_FUNCTIONS = frozenset({"torch.cat", "torch.concat", "torch.concatenate", "torch.stack", "torch.vstack",
                              "torch.hstack"})

# A name of a data source (``training.iterates_data``, TGL201's premise): a ``for`` loop over one walks data.
DATA_SOURCE_NAME = re.compile(r"(loader|data|batch|dataset|sampler|iterator|^dl$|^ds$|_dl$|_ds$|episodes?$|^env"
                              r"|^(tr|va|val|valid|validation|test|train|dev|eval)(_|$))", re.I)
# A name that holds a gradient scaler when the file does not show its construction: the last
# part of a dotted name ending in "scaler" (``amp_facts.is_scaler``, TGL302's premise).
SCALER_NAME = re.compile(r"scaler$", re.IGNORECASE)


def last_names(qualified: "frozenset[str] | dict[str, str] | set[str]") -> frozenset[str]:
    """The last names of qualified names (``torch.nn.functional.dropout`` ->
    ``dropout``): what the prefilter's call scan records for a call the
    analysis resolves to one of them."""
    return frozenset(q.rsplit(".", 1)[-1] for q in qualified)


# -- name resolution (:mod:`.names`) --------------------------------------------------------------
# Public aliases of one object, mapped to the name rules compare against.
CANONICAL = {
    "torch.autograd.no_grad": "torch.no_grad",
    "torch.autograd.grad_mode.no_grad": "torch.no_grad",
    "torch.autograd.enable_grad": "torch.enable_grad",
    "torch.autograd.grad_mode.enable_grad": "torch.enable_grad",
    "torch.autograd.set_grad_enabled": "torch.set_grad_enabled",
    "torch.autograd.grad_mode.set_grad_enabled": "torch.set_grad_enabled",
    "torch.autograd.grad_mode.inference_mode": "torch.inference_mode",
    "torch.autograd.inference_mode": "torch.inference_mode",
    "torch.autograd.backward": "torch.autograd.backward",
    "torch.nn.functional": "torch.nn.functional",
}

# Names that scripts, notebooks and tutorials use by convention for torch
# modules. A file that never binds one of them (a notebook whose import cell
# is missing, a snippet pasted from a tutorial) means the conventional module.
CONVENTIONAL = {
    "nn": "torch.nn",
    "F": "torch.nn.functional",
    "optim": "torch.optim",
    "autograd": "torch.autograd",
}
