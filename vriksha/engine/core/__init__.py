"""The engine core: requests in, one scheduled forward pass per step, outputs out. It imports no backend: the
model is reached through `runner/load.py`, and the kernels the core uses come to it as objects chosen at load."""
