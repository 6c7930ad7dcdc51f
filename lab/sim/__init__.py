"""A simulated GPU training cluster with fault injection, for demos, evaluation and end-to-end tests.

Per node: a dcgm-exporter-compatible endpoint, a kernel log, a training log, real (sleeping) rank
processes under a torchrun-like launcher, and optionally a real `faultline agent`.

Deliberately imports nothing here: the rank processes run `python -m lab.sim.rank` and must stay
small, so importing the package must not pull in the runner or the model.
"""
