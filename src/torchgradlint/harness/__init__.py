"""Runtime harness: runs fixtures under torch and measures the defect each rule claims.

Modules:
    probes   runtime sanitizers built on torch's own instrumentation (imports torch)
    worker   ``python -m torchgradlint.harness.worker``: one fixture, one device, one subprocess
    runner   plans fixtures x devices, lints, runs workers in parallel, pairs the verdicts
    report   table / json / markdown rendering (no torch needed)
    cli      ``torchgradlint harness``

Only :mod:`probes`, :mod:`worker` and :mod:`devices` import torch; the linter never does.
"""
