"""The suite's engines and trainers compute in fp32, the dtype their reference outputs were written for.

`dtype="auto"` would pick bf16 on a CPU with fast bf16 (AMX, AVX512-BF16) and change the numbers tests compare
against fp32 Transformers references; `$VRIKSHA_DTYPE` pins it here (and in the servers and trainers the tests
start). The tests of the choice itself (tests/engine/test_dtype_auto.py, tests/train/test_precision.py) unset it.
"""

import os

os.environ.setdefault("VRIKSHA_DTYPE", "float32")
