"""The torch side: pipeline stages, process groups, train steps, checkpoints, profiling.

This package is the only one that imports torch; ``topology`` and ``checkpoint``'s manifest code
do not, so the Ray side can import them in a light driver process. See docs/runtime.md.
"""
