"""One module per rule, named after the rule's kebab name (underscored).

Every module defines one :class:`~torchgradlint.registry.Rule` subclass;
:func:`~torchgradlint.registry.all_rules` discovers them.
"""

# Every shipped rule's code, in order (tests/test_engine.py checks it against
# the discovered rules). The flake8 plugin decides from it whether any TGL
# rule is selected without importing the rules, and so LibCST.
RULE_CODES = ("TGL001", "TGL002", "TGL006", "TGL007", "TGL101", "TGL102", "TGL103", "TGL104", "TGL201",
              "TGL203", "TGL303", "TGL304", "TGL305")

# Each rule's prefilter metadata (:attr:`Rule.prefilter`, :attr:`Rule.needs_backward`,
# :attr:`Rule.needs_grad_evidence`), so that the flake8 plugin can rule a file
# out without importing the rules and LibCST (about 0.4 s per flake8 process).
# tests/test_flake8.py checks it against the rule classes.
RULE_PREFILTER = {
    "TGL001": ((("backward",), ("step",)), True, False),
    "TGL002": ((("backward", "grad"), ("no_grad", "inference_mode", "set_grad_enabled")), False, False),
    "TGL006": ((("__init__",),), False, False),
    "TGL007": ((("forward",), ("Linear", "Bilinear", "Conv", "Norm", "Embedding", "RNN", "LSTM", "GRU", "Attention",
                               "Transformer", "PReLU")), False, False),
    "TGL101": ((("append", "extend", "insert", "+", "["),), False, True),
    "TGL102": ((("retain_graph",),), True, False),
    "TGL104": ((("Function",), ("ctx", "backward")), False, False),
    "TGL103": ((("no_grad", "inference_mode", "enable_grad"),), False, False),
    "TGL201": ((("no_grad", "inference_mode", "set_grad_enabled", "backward"),), False, False),
    "TGL203": ((("dropout", "scaled_dot_product_attention"),), False, False),
    "TGL303": ((("softmax", "Softmax", "sigmoid", "Sigmoid", "expit"),
                ("cross_entropy", "CrossEntropyLoss", "nll_loss", "NLLLoss", "with_logits", "WithLogits", "log(",
                 ".log()", "log as")), False, False),
    "TGL304": ((("gradcheck",),), False, False),
    "TGL305": ((("half", "float16"), ("Adam",)), False, False),
}
