"""The experiments' entry points; run each from the repository root as `python -m experiments.NAME`
(the root is then on sys.path, so config files can build on one another: `from configs import
scratch`)."""
