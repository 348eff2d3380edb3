"""One global forward pre-hook and one forward hook for every probe that watches module calls.

Several probes watch ``nn.Module`` calls: some every call (which parameters a forward uses, a
forward with grad mode off), some only the top-level ones, not made inside another module's
forward (the census of training forwards, graphs recorded for nothing, the eval-mode spread).
Each global hook torch runs costs about 0.4 µs per module call before its body runs, and each
top-level watcher kept its own nesting depth; on a small RL policy (a 5-layer MLP called tens
of thousands of times per rollout) that was a fifth of the probes' cost. :data:`CALLS` keeps
one depth and registers one pre-hook and one hook while at least one probe subscribes; it
calls the subscribers in the order they subscribed.

Hooks are ``torch.nn.modules.module.register_module_forward_pre_hook`` /
``register_module_forward_hook``
(https://pytorch.org/docs/stable/generated/torch.nn.modules.module.register_module_forward_hook.html).
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any, Callable, Optional

import torch

EachPre = Callable[[torch.nn.Module, Any], None]
TopPre = Callable[[torch.nn.Module], None]
TopPost = Callable[[torch.nn.Module, Any, Any], None]


class ModuleCalls:
    """The module calls of the process, dispatched to the probes that subscribe.

    ``each_pre(module, args)`` runs before every module call; ``top_pre(module)`` before a
    top-level call (depth 0); ``top_post(module, args, output)`` after a top-level call
    returns. A forward that raises leaves the depth as torch leaves its hooks: the post-hook
    does not run (as with one hook pair per probe before).
    """

    def __init__(self) -> None:
        self.depth = 0
        self.each_pre: list[EachPre] = []
        self.top_pre: list[TopPre] = []
        self.top_post: list[TopPost] = []
        self._handles: Optional[list] = None

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        if self.depth == 0:
            for fn in self.top_pre:
                fn(module)
        self.depth += 1
        for each in self.each_pre:
            each(module, args)
        return None

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self.depth = max(0, self.depth - 1)
        if self.depth == 0:
            for fn in self.top_post:
                fn(module, args, output)
        return None

    def subscribe(self, stack: ExitStack, *, each_pre: Optional[EachPre] = None, top_pre: Optional[TopPre] = None,
                  top_post: Optional[TopPost] = None) -> None:
        """Add the given callbacks until ``stack`` closes (the hooks go when the last subscriber leaves)."""
        added = [(lst, fn) for lst, fn in ((self.each_pre, each_pre), (self.top_pre, top_pre),
                                           (self.top_post, top_post)) if fn is not None]
        if self._handles is None:
            from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

            self.depth = 0
            self._handles = [register_module_forward_pre_hook(self._pre), register_module_forward_hook(self._post)]
        for lst, fn in added:
            lst.append(fn)
        stack.callback(self._unsubscribe, added)

    def _unsubscribe(self, added: list) -> None:
        for lst, fn in added:
            lst.remove(fn)
        if not (self.each_pre or self.top_pre or self.top_post) and self._handles is not None:
            for handle in self._handles:
                handle.remove()
            self._handles = None


#: the process's dispatcher (module hooks are global in torch too)
CALLS = ModuleCalls()
