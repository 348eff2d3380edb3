"""Process-wide instrumentation the probes listen to (imports torch).

* :func:`install` wraps, once per process, ``torch.autograd.backward`` /
  ``torch.autograd.grad`` (``Tensor.backward`` calls the former through the module
  attribute) and the functional mode-dependent ops of :mod:`torch.nn.functional`
  (``dropout`` and its variants, ``batch_norm``, ``scaled_dot_product_attention``);
  ``nn.Dropout``, ``nn.BatchNorm*`` and ``nn.MultiheadAttention`` call these through
  the module attribute, so they are covered too. Install before user code runs so
  that ``from torch.autograd import grad`` binds the wrapper. The wrappers only
  forward to the original and notify listeners: results are unchanged.
* :func:`install` also notes every ``torch.no_grad()`` / ``torch.inference_mode()`` the
  user's code builds, and whether it was entered (``with``) or used as a decorator:
  :func:`discarded_grad_mode_sites` names those built and never used (a bare
  ``torch.no_grad()`` statement switches nothing off). Installed before the program
  runs, so module-level statements are seen too.
* :func:`user_stack` names the user's frames (not torch, not torchgradlint, not the
  standard library) of the current call, innermost first: where a probe attributes
  a measured defect.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

#: ``(path, line) -> [built, used]``: grad-mode context managers the user's code built, and how many of
#: them were entered or used as decorators
GRAD_MODE_SITES: dict[tuple[str, int], list[int]] = {}

#: listeners: objects with any of ``on_backward_begin(kind, roots, retain, create_graph)``,
#: ``on_backward_end(kind, result, create_graph)``, ``on_backward_error(kind, exc)``,
#: ``on_mode_op(kind, training, details)``
LISTENERS: list[Any] = []
_installed = False

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB_DIRS = tuple({os.path.abspath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib")})
_user_cache: dict[str, bool] = {}
_abs_cache: dict[str, str] = {}


def _abspath(filename: str) -> str:
    """``os.path.abspath(filename)``, resolved once per absolute code file name (the stack walks that name
    the user's line run on every grad-mode switch and backward). A relative name (a script run as
    ``python train.py``) is resolved each time: it depends on the working directory, and two runs in one
    process (``watch()``, the test suite) may run different files of that name from different folders."""
    path = _abs_cache.get(filename)
    if path is None:
        path = os.path.abspath(filename)
        if os.path.isabs(filename):
            _abs_cache[filename] = path
    return path


def is_user_file(filename: str) -> bool:
    """``True`` for a file of the user's program: not torch, torchgradlint or the standard library."""
    verdict = _user_cache.get(filename)
    if verdict is None:
        if filename.startswith("<"):  # <stdin>, <string>, <ipython-input-...>: the user's; <frozen ...>: not
            verdict = not filename.startswith("<frozen")
        else:
            path = _abspath(filename)
            verdict = not (path.startswith(_TORCH_DIR) or path.startswith(_OWN_DIR)
                           or path.startswith(_STDLIB_DIRS))
        _user_cache[filename] = verdict
    return verdict


#: code objects of the wrappers :func:`install` puts around torch's API: they only pass the user's call on
_PASS_THROUGH: set[Any] = set()


def is_probe_frame(frame: Any) -> bool:
    """``True`` for a frame of torchgradlint's own work (a probe inspecting a tensor), not one of the wrappers
    that pass the user's own call on to torch."""
    return _abspath(frame.f_code.co_filename).startswith(_OWN_DIR) and frame.f_code not in _PASS_THROUGH


Stack = list[tuple[str, int]]


def user_stack(limit: int = 6, frame: Any = None) -> Stack:
    """``[(path, line), ...]`` of the user's frames of the current call, innermost first.

    Up to ``limit`` frames; ``frame`` starts the walk (default: the caller's frame).
    """
    f = frame if frame is not None else sys._getframe(1)
    out: Stack = []
    while f is not None and len(out) < limit:
        name = f.f_code.co_filename
        if is_user_file(name):
            out.append((_abspath(name) if not name.startswith("<") else name, f.f_lineno))
        f = f.f_back
    return out


def user_frames(limit: int = 8, frame: Any = None) -> list[Any]:
    """The user's frames of the current call (frame objects), innermost first."""
    f = frame if frame is not None else sys._getframe(1)
    out = []
    while f is not None and len(out) < limit:
        if is_user_file(f.f_code.co_filename):
            out.append(f)
        f = f.f_back
    return out


def _notify(method: str, *args: Any) -> None:
    for listener in list(LISTENERS):
        fn = getattr(listener, method, None)
        if fn is not None:
            fn(*args)


def _as_tuple(x: Any) -> tuple:
    if isinstance(x, torch.Tensor):
        return (x,)
    try:
        return tuple(x)
    except TypeError:
        return (x,)


def _wrap_autograd(kind: str, orig: Callable, retain_pos: int, create_pos: int) -> Callable:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not LISTENERS:
            return orig(*args, **kwargs)
        create = kwargs.get("create_graph", args[create_pos] if len(args) > create_pos else False)
        retain = kwargs.get("retain_graph", args[retain_pos] if len(args) > retain_pos else None)
        retain = bool(create) if retain is None else bool(retain)
        first = args[0] if args else kwargs.get("tensors", kwargs.get("outputs"))
        roots = _as_tuple(first) if first is not None else ()
        _notify("on_backward_begin", kind, roots, retain, bool(create))
        try:
            result = orig(*args, **kwargs)
        except Exception as exc:
            _notify("on_backward_error", kind, exc)
            raise
        _notify("on_backward_end", kind, result, bool(create))
        return result

    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    wrapper.__doc__ = orig.__doc__
    wrapper.__name__ = getattr(orig, "__name__", kind)
    _PASS_THROUGH.add(wrapper.__code__)
    return wrapper


def _arg(args: tuple, kwargs: dict, pos: int, name: str, default: Any) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[pos] if len(args) > pos else default


def _wrap_mode_op(kind: str, orig: Callable, read: Callable[[tuple, dict], tuple]) -> Callable:
    """``read(args, kwargs) -> (training, p_or_None, running_stats_tuple)``."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not LISTENERS or torch.is_grad_enabled():
            return orig(*args, **kwargs)
        training, p, stats = read(args, kwargs)
        if not training or (p is not None and not p > 0):
            return orig(*args, **kwargs)
        before = [s.clone() for s in stats]  # only on this (defective or deliberate) path
        result = orig(*args, **kwargs)
        changed = any(not torch.equal(s, b) for s, b in zip(stats, before))
        _notify("on_mode_op", kind, {"p": p, "running_stats_changed": changed})
        return result

    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    wrapper.__doc__ = orig.__doc__
    wrapper.__name__ = getattr(orig, "__name__", kind)
    _PASS_THROUGH.add(wrapper.__code__)
    return wrapper


def _dropout_args(args: tuple, kwargs: dict) -> tuple:
    return bool(_arg(args, kwargs, 2, "training", True)), float(_arg(args, kwargs, 1, "p", 0.5)), ()


def _batch_norm_args(args: tuple, kwargs: dict) -> tuple:
    stats = tuple(s for s in (_arg(args, kwargs, 1, "running_mean", None), _arg(args, kwargs, 2, "running_var", None))
                  if isinstance(s, torch.Tensor))
    training = bool(_arg(args, kwargs, 5, "training", False))
    return training and bool(stats), None, stats


def _sdpa_args(args: tuple, kwargs: dict) -> tuple:
    return True, float(_arg(args, kwargs, 4, "dropout_p", 0.0)), ()


_DROPOUTS = ("dropout", "alpha_dropout", "feature_alpha_dropout", "dropout1d", "dropout2d", "dropout3d")


def install() -> None:
    """Install the autograd, functional and grad-mode manager wrappers once per process (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    # backward(tensors, grad_tensors, retain_graph, create_graph, ...)
    torch.autograd.backward = _wrap_autograd("backward", torch.autograd.backward, 2, 3)
    # grad(outputs, inputs, grad_outputs, retain_graph, create_graph, ...)
    torch.autograd.grad = _wrap_autograd("grad", torch.autograd.grad, 3, 4)
    for name in _DROPOUTS:
        setattr(F, name, _wrap_mode_op("dropout", getattr(F, name), _dropout_args))
    F.batch_norm = _wrap_mode_op("batch_norm", F.batch_norm, _batch_norm_args)
    F.scaled_dot_product_attention = _wrap_mode_op("sdpa", F.scaled_dot_product_attention, _sdpa_args)
    _track_grad_mode_managers()


def _track_grad_mode_managers() -> None:
    """Wrap ``__init__``, ``__enter__`` and ``__call__`` of ``no_grad`` and ``inference_mode`` (results unchanged)."""
    from torch.autograd import grad_mode

    def built(init: Callable) -> Callable:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
            init(self, *args, **kwargs)
            caller = sys._getframe(1)
            path = caller.f_code.co_filename
            if is_user_file(path):
                key = (_abspath(path) if not path.startswith("<") else path, caller.f_lineno)
                GRAD_MODE_SITES.setdefault(key, [0, 0])[0] += 1
                self.__dict__["_tgl_site"] = key

        _PASS_THROUGH.add(__init__.__code__)
        return __init__

    def used(method: Callable) -> Callable:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            key = self.__dict__.pop("_tgl_site", None) if hasattr(self, "__dict__") else None
            if key is not None:
                GRAD_MODE_SITES[key][1] += 1
            return method(self, *args, **kwargs)

        wrapper.__name__ = method.__name__
        wrapper.__doc__ = method.__doc__
        _PASS_THROUGH.add(wrapper.__code__)
        return wrapper

    for cls in (grad_mode.no_grad, grad_mode.inference_mode):
        cls.__init__ = built(cls.__init__)  # type: ignore[method-assign]
        cls.__enter__ = used(cls.__enter__)  # type: ignore[method-assign]
        cls.__call__ = used(cls.__call__)  # type: ignore[method-assign]


def discarded_grad_mode_sites() -> list[tuple[str, int]]:
    """``(path, line)`` of each ``no_grad()`` / ``inference_mode()`` the user's code built and never entered
    nor used as a decorator (since :func:`install`), sorted."""
    return sorted(key for key, (n_built, n_used) in GRAD_MODE_SITES.items() if n_built > n_used)


def outermost_module_call(frame: Any = None) -> Optional[tuple[Any, Any]]:
    """``(module, frame)`` of the outermost ``nn.Module.__call__`` on the current call stack, else ``None``.

    ``frame`` is that call's own frame; its ``f_back`` is the caller (the user's line
    that called the model).
    """
    f = frame if frame is not None else sys._getframe(1)
    found = None
    while f is not None:
        if f.f_code.co_name in ("_call_impl", "_wrapped_call_impl") and f.f_code.co_filename.startswith(_TORCH_DIR):
            mod = f.f_locals.get("self")
            if isinstance(mod, torch.nn.Module):
                found = (mod, f)
        f = f.f_back
    return found


def called_from_library(frame: Any = None) -> bool:
    """Whether the first frame outside torchgradlint (from ``frame``, default the caller's) is torch's own
    code: an autograd call torch made (``gradcheck``'s ``autograd.grad``), not the user's."""
    f = frame if frame is not None else sys._getframe(1)
    while f is not None and _abspath(f.f_code.co_filename).startswith(_OWN_DIR):
        f = f.f_back
    return f is not None and _abspath(f.f_code.co_filename).startswith(_TORCH_DIR)


def code_on_stack(codes: "set[Any]", frame: Any = None) -> Optional[Any]:
    """The first code object of ``codes`` found on the current call stack, else ``None``."""
    f = frame if frame is not None else sys._getframe(1)
    while f is not None:
        if f.f_code in codes:
            return f.f_code
        f = f.f_back
    return None
