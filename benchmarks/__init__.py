"""Benchmarks: scripts run from a checkout (``python benchmarks/NAME.py``); a package so one can import
another (``benchmarks.cutout_data``) and mypy names them once."""
