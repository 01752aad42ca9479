"""The project's benchmarks: each module is a command, run from the repository root as
``python -m benchmarks.NAME [--help]`` (``python -m benchmarks.bench`` runs the set docs/performance.md shows).
What they share (where results go, the machine they ran on, memory readings, writing a result) is in
:mod:`benchmarks.common`. Benchmarks are not part of the installed package."""
