"""Benchmarks of lerobot_nodes (not installed with the package): ``python -m benchmarks.run --suite quick|full``.

The scripts also run by path (``python benchmarks/run.py``); they import their siblings from this folder.
See ``benchmarks/README.md`` and ``benchmarks/RESULTS.md``.
"""
