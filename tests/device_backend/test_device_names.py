"""No engine, trainer, environment or weights code names a device kind: vriksha/device.py is the one place."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEVICE_STRING = re.compile(r"""(["'])(cpu|cuda)(:\d+)?\1|torch\.cuda\b|\.cuda\(""")
# the sandbox names a resource limit "cpu" (CPU seconds), not a device
ALLOWED = {
    ("vriksha/envs/sandbox/result.py", 'return "cpu"'),
    ("vriksha/engine/platform/compute_dtype.py", '"cpu": self.cpu,'),  # the CPU's description, a record key
}


def test_no_device_kind_is_named_outside_the_device_module():
    found = []
    for package in ("engine", "train", "envs", "weights"):
        for path in sorted((ROOT / "vriksha" / package).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if DEVICE_STRING.search(line) and (rel, line.strip()) not in ALLOWED:
                    found.append(f"{rel}:{number}: {line.strip()}")
    assert not found, "device kinds named outside vriksha/device.py:\n" + "\n".join(found)
