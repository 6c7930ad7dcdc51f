"""A real multi-node torchrun job (PyTorch CPU, gloo) on one host, with fault injection.

Used by `faultline eval` (the real-torchrun scenarios) and by the integration tests.
`train.py` is the training script torchrun runs; `cluster.py` launches one torchrun per virtual node.
Nothing here imports torch at import time, so the harness stays cheap where torch is missing.
"""
