"""The engine on this machine: every decision about the platform taken once at load into one plan (`plan.py`),
the kernel sets and the native C and Triton kernels they bind, and the linear paths (dense, packed, hub layers)."""
