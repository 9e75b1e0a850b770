"""The experiments' entry points; run each from the repository root as `python -m experiments.NAME`
(the root is then on sys.path, so config files can build on one another: `from configs import
scratch`): train, evaluate, sample, export, plan; cli holds what they share. Studies are in
experiments/studies/ (`python -m experiments.studies.NAME`), the documentation tools in
experiments/tools/ (`python -m experiments.tools.NAME`), benchmarks in benchmarks/ (`python -m
benchmarks.NAME`)."""
