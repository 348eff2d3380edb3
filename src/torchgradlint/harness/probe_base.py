"""What every probe shares: the :class:`Probe` base class, its :class:`Measurement`, and how a probe
charges a measured defect to the user's source line (imports torch through :mod:`.instrument`).

The probe modules (:mod:`.probes`, :mod:`.probes_numerics`, :mod:`.probes_structure`, ...) import
this module and nothing of each other; :mod:`.probe_registry` finds them all.
"""

from __future__ import annotations

import sys
import weakref
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Iterator, Optional, Sequence

from . import instrument
from .probe_map import probe_rules

KIB = 1024.0


@dataclass
class Measurement:
    """A probe's decision for one program on one device.

    ``figure`` is the headline number in ``unit``; ``display`` the human form
    ("+6.4 KiB/step", "stale-gradient steps: 7/8"); ``threshold`` states the rule
    that separates defect from healthy; ``findings`` lists each measured defect as
    ``{"code", "stack": [[path, line], ...] (innermost first, may be empty when the
    probe cannot attribute a line), "figure", "unit", "display"}``; ``details`` holds
    the other measured numbers (all JSON-able).
    """

    probe: str
    figure: float
    unit: str
    display: str
    threshold: str
    defect: bool
    details: dict = field(default_factory=dict)
    findings: list = field(default_factory=list)

    def to_json(self) -> dict:
        """This measurement as a JSON-able dict."""
        return asdict(self)


def grad_mark(g: Any) -> Optional[tuple]:
    """A gradient's contents without copying it: a weak reference to the tensor and its version counter
    (``None`` for no gradient).

    A weak reference, not ``id()``/``data_ptr()``: after ``zero_grad()`` frees a gradient, the next
    backward's new gradient often lands at the same address (a GAN's generator gradients, reset and
    recomputed each iteration, then read as the old ones)."""
    if g is None:
        return None
    return (weakref.ref(g), g._version)


def unchanged(g: Any, mark: Optional[tuple]) -> bool:
    """Whether ``g`` is the very gradient ``mark`` (a :func:`grad_mark`) recorded, not modified since."""
    return g is not None and mark is not None and mark[0]() is g and g._version == mark[1]


def own_parameters(module: Any) -> list:
    """The parameters a module registers itself (``module.parameters(recurse=False)``), read from its
    ``_parameters`` table: a module hook runs on every forward of every module, and the generator
    behind ``parameters()`` costs about 3 µs a call against 0.4 µs for the table (a tenth of a
    second per 30,000 forwards of a small RL policy, per probe). Falls back to ``parameters()``
    for an object without the table."""
    table = getattr(module, "_parameters", None)
    if isinstance(table, dict):
        return [p for p in table.values() if p is not None]
    return list(module.parameters(recurse=False))


def human_bytes(n: float, signed: bool = False) -> str:
    """``6553.6`` -> ``"6.4 KiB"`` (binary units); ``signed`` adds ``+`` to non-negative values."""
    sign = "-" if n < 0 else ("+" if signed else "")
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            text = f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
            return sign + text
        n /= 1024
    return sign + f"{n:.1f} GiB"  # pragma: no cover


def slope(points: Sequence[tuple[float, float]]) -> Optional[float]:
    """Least-squares slope of ``(x, y)`` points; ``None`` with fewer than two distinct x."""
    pts = [(float(x), float(y)) for x, y in points if y is not None]
    if len({x for x, _ in pts}) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    var = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / var


def finding(code: str, stack: Any, figure: float, unit: str, display: str) -> dict:
    """One measured defect of rule ``code`` (the :class:`Measurement` ``findings`` item).

    ``stack``: ``[(path, line), ...]`` innermost first, or empty when no line is attributed.
    """
    return {"code": code, "stack": [list(s) for s in (stack or [])], "figure": figure, "unit": unit,
            "display": display}


def merge_stacks(*stacks: Optional[Sequence[Sequence[Any]]]) -> list[list]:
    """Concatenate stacks, dropping repeated ``(path, line)`` frames: a cause's line, then where it showed."""
    out: list[list] = []
    for stack in stacks:
        for path, line in stack or ():
            if [path, line] not in out:
                out.append([path, line])
    return out


class Probe:
    """Base class of the runtime probes. One instance observes one run.

    Lifecycle: ``with probe.observe(device): <program>``; :meth:`on_main_return` at the end
    of a fixture's ``main`` (its locals alive) when :attr:`needs_frame`; :meth:`on_exception`
    when the program raised; :meth:`collect` (:meth:`sample` plus the attributed sites)
    after the run; :meth:`judge` (:meth:`decide` plus findings from the sites) over the
    samples keyed by step count. Listener callbacks (see :mod:`.instrument`) are no-ops here.

    **Reporting the line that caused a defect.** The harness checks each finding against the
    fixture's ``# expect:`` lines and ``torchgradlint run`` reports it at a source line, so a
    probe names where each defect happened. A probe does that with one call, at the moment it
    sees the defect (inside its hook or wrapper, while the user's frames are on the stack)::

        self.attribute("TGL303", "cross_entropy fed probabilities")      # the current user line
        self.attribute("TGL305", "Adam step made parameters NaN", stack=creation_stack + step_stack)

    Events with the same code, text and stack are one *site*; ``amount`` adds up in its
    ``count`` (the record is returned, so a probe may keep a maximum there instead). A
    stack is ``[(path, line), ...]`` innermost first, as :func:`.instrument.user_stack`
    gives it (the user's frames only: not torch, not torchgradlint, not the standard
    library); :meth:`user_stack` takes one to keep for later (e.g. where a module was
    built). When a line other than the current one caused the defect, put it first (a
    helper: :func:`merge_stacks`): the harness accepts a finding whose stack touches an
    expected line, and ``run`` reports the first frame that ``check`` also flags, else the
    first frame of the user's code. Nothing else is needed: :meth:`collect` adds the sites
    to the sample (``"attributed"``), and :meth:`judge` turns them into :class:`Measurement` findings ("<what>
    (<count> <unit>)") when :meth:`decide` measured a defect and made no findings itself.
    A defect without any site becomes one finding without a line for a probe of one rule.
    """

    name: ClassVar[str] = ""
    unit: ClassVar[str] = ""
    threshold: ClassVar[str] = ""
    needs_frame: ClassVar[bool] = False
    #: multiples of N the harness runs a fixture at
    schedule: ClassVar[tuple[int, ...]] = (1, 2)

    def __init__(self) -> None:
        self.device = "cpu"
        self.steps: Optional[int] = None
        self._sites: dict[tuple, dict] = {}

    @classmethod
    def rules(cls) -> list[str]:
        """Rule codes this probe measures (from :mod:`.probe_map`)."""
        return probe_rules(cls.name)

    @contextmanager
    def observe(self, device: str = "cpu", steps: Optional[int] = None) -> Iterator["Probe"]:
        """Install the probe's hooks for one run, remove them afterwards (``steps``: the run's step count,
        when known; ``run`` does not know it)."""
        self.device, self.steps = device, steps
        instrument.install()
        instrument.LISTENERS.append(self)
        try:
            with ExitStack() as stack:
                self._install(stack)
                yield self
        finally:
            instrument.LISTENERS.remove(self)

    def _install(self, stack: ExitStack) -> None:
        """Register hooks; push their removal onto ``stack``."""

    def on_main_return(self, frame: Any) -> None:
        """Called at the return of a fixture's ``main`` while its locals are alive."""

    def on_exception(self, exc: BaseException) -> bool:
        """The program raised ``exc``; ``True`` if it is this probe's measured defect."""
        return False

    # attribution ---------------------------------------------------------------------------------
    @staticmethod
    def user_stack(frame: Any = None, limit: int = 6) -> list[list]:
        """``[[path, line], ...]``: the user's frames of the current call (from ``frame``, default the
        caller's), innermost first, JSON-able."""
        return [list(s) for s in instrument.user_stack(limit, frame if frame is not None else sys._getframe(1))]

    def attribute(self, code: str, what: str, *, amount: float = 1.0, stack: Optional[Sequence[Any]] = None,
                  frame: Any = None, unit: Optional[str] = None) -> dict:
        """Charge a measured defect of rule ``code`` to a site: ``what`` happened at ``stack``.

        ``stack`` defaults to the user's frames of the current call (from ``frame``, default
        the caller's); ``unit`` names what ``count`` counts (default: the probe's :attr:`unit`).
        Returns the site record ``{"code", "what", "stack", "count", "unit"}``.
        """
        if stack is None:
            stack = instrument.user_stack(frame=frame if frame is not None else sys._getframe(1))
        frames = [list(s) for s in stack]
        key = (code, what, repr(frames))
        rec = self._sites.get(key)
        if rec is None:
            rec = self._sites[key] = {"code": code, "what": what, "stack": frames, "count": 0.0,
                                      "unit": unit or self.unit}
        rec["count"] += amount
        return rec

    def attributed(self) -> list[dict]:
        """The attributed sites so far (copies), in the order they were first seen."""
        return [dict(r) for r in self._sites.values()]

    def collect(self) -> dict:
        """:meth:`sample` plus ``"attributed"`` (the sites): what the harness and ``run`` keep of one run."""
        out = self.sample()
        out["attributed"] = self.attributed()
        return out

    @classmethod
    def site_findings(cls, samples: dict[int, dict]) -> list[dict]:
        """Findings from the attributed sites of the run with the fewest steps that has any."""
        for n in sorted(samples):
            sites = samples[n].get("attributed") or []
            if sites:
                return [finding(s["code"], s["stack"], float(s["count"]), s.get("unit", cls.unit),
                                f"{s['what']} ({s['count']:g} {s.get('unit', cls.unit)})") for s in sites]
        return []

    @classmethod
    def judge(cls, samples: dict[int, dict]) -> Measurement:
        """:meth:`decide`, with findings from the sites when it measured a defect and made none."""
        m = cls.decide(samples)
        if m.defect and not m.findings:
            m.findings = cls.site_findings(samples)
            rules = cls.rules()
            if not m.findings and len(rules) == 1:
                m.findings = [finding(rules[0], [], m.figure, m.unit, m.display)]
        return m

    # to implement --------------------------------------------------------------------------------
    def sample(self) -> dict:
        """The JSON-able figures of this run."""
        raise NotImplementedError

    @classmethod
    def decide(cls, samples: dict[int, dict]) -> Measurement:
        """Measurement from the samples keyed by step count."""
        raise NotImplementedError
