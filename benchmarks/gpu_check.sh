#!/usr/bin/env bash
# The checks that need a GPU, in one run (docs/kernels.md). From the repository root on a machine with a
# CUDA (or other Triton-backed) device, torch built for it, triton and the test extras installed:
#
#   bash benchmarks/gpu_check.sh                 # everything, figures under $OUT (default /tmp/gpu_check)
#   QUICK=1 bash benchmarks/gpu_check.sh         # smaller decode benchmark, bf16 parity only
#
# 1. the Triton kernels against torch, compiled (tests/engine/platform/triton_cases.py without the interpreter)
# 2. every tested family on the device: engine greedy tokens vs generate(), triton and torch kernel sets,
#    fp32 and bf16 (benchmarks/gpu_parity.py; the table goes to docs/models.md)
#    (decode steps replayed from CUDA graphs where --cuda-graphs auto takes them: the cells marked "(graphs)")
# 3. the families' parity tests of the suite (tests/engine/test_families.py, the engine on the CPU as in CI) and
#    the CUDA-graph tests (tests/engine/runner/test_decode_graphs.py: capture, replay, weights moved to new memory)
# 4. decode tok/s, triton vs torch kernel sets, each with CUDA graphs off and auto, bf16
#    (benchmarks/kernel_decode_speed.py)
# Each step runs even when an earlier one failed; the exit status is 1 if any failed.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET
OUT="${OUT:-/tmp/gpu_check}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
status=0

step() {  # step NAME COMMAND...: run, keep its log, note a failure
  local name="$1"
  shift
  echo "=== $name: $*"
  local start=$SECONDS
  "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc after $((SECONDS - start)) s"
  [ "$rc" -eq 0 ] || status=1
}

"$PY" - <<'EOF' | tee "$OUT/env.log"
import importlib.util, torch
import vriksha.device as devices
d = devices.default_device()
print("torch", torch.__version__, "device", devices.describe(d))
print("triton", importlib.util.find_spec("triton") and __import__("triton").__version__)
from vriksha.engine import kernel_sets
print("kernel sets here (bf16):", kernel_sets.available(d, torch.bfloat16))
if devices.is_host(d):
    raise SystemExit("no accelerator here: these checks need a GPU")
EOF
[ "${PIPESTATUS[0]}" -eq 0 ] || exit 1

if [ "${QUICK:-0}" = 1 ]; then
  dtypes=bfloat16
  speed=(--scale small --batch-sizes 1,16 --new-tokens 64)
else
  dtypes=float32,bfloat16
  speed=(--scale 1b --batch-sizes 1,16,64)
fi
step triton_kernels "$PY" -m pytest tests/engine/platform/triton_cases.py -q -p no:cacheprovider --junitxml="$OUT/triton_cases.xml"
step gpu_parity "$PY" benchmarks/gpu_parity.py --kernels triton,torch --dtypes "$dtypes" --json "$OUT/gpu_parity.json"
step families "$PY" -m pytest tests/engine/test_families.py -q -x -p no:cacheprovider
step decode_graphs "$PY" -m pytest tests/engine/runner/test_decode_graphs.py -q -p no:cacheprovider -rs
step decode_speed "$PY" benchmarks/kernel_decode_speed.py --kernels triton,torch --cuda-graphs off,auto \
  --dtype bfloat16 "${speed[@]}" \
  --json "$OUT/decode_speed.json"
echo "logs and figures in $OUT; exit $status"
exit $status
