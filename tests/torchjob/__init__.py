"""A real multi-node torchrun job (PyTorch CPU, gloo) on one host, with fault injection, for integration tests.

`train.py` is the training script torchrun runs; `cluster.py` launches one torchrun per virtual node.
Nothing here imports torch at import time, so the harness stays cheap for tests that skip without it.
"""
