"""Every probe class by name (imports torch).

The probes live in this package's ``probes.py`` and ``probes_*.py`` modules; each imports
only :mod:`.probe_base`. :func:`all_probes` imports those modules and collects the
:class:`~.probe_base.Probe` subclasses with a ``name`` defined in them, so a new probe
module is found without an edit here (and no probe module imports another).
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache

from .probe_base import Probe


def _is_probe_module(name: str) -> bool:
    return name == "probes" or name.startswith("probes_")


@lru_cache(maxsize=1)
def _discover() -> tuple[tuple[str, type[Probe]], ...]:
    package = importlib.import_module(__package__)
    found: dict[str, type[Probe]] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if not _is_probe_module(info.name):
            continue
        module = importlib.import_module(f"{__package__}.{info.name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Probe) and obj.__module__ == module.__name__ and obj.name:
                if found.get(obj.name, obj) is not obj:
                    raise ValueError(f"two probes named {obj.name!r}: {found[obj.name].__module__} and "
                                     f"{module.__name__}")
                found[obj.name] = obj
    return tuple(found.items())


def all_probes() -> dict[str, type[Probe]]:
    """``{probe name: class}`` for every probe module of the harness (core probes first).

    Raises:
        ValueError: two probe classes share a name.
    """
    return dict(_discover())
