"""Configuration files that ship with the package (installed as ``stabledrl_bench.configs``).

``recipes/`` holds each method's official GPU settings, ``presets/`` the comparisons ``reproduce`` runs (they
reuse the recipes, so the paper's settings are written once), ``accelerate/`` the launcher configs.
"""
