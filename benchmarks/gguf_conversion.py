"""Converting a GGUF through Transformers with the file parsed once and as Transformers alone does it.

Each run converts the file into a fresh directory in a fresh process (what a first load does), once inside
`gguf_parsed_once()` and once without it, and prints both times and whether the converted files are
byte-identical.

    python benchmarks/gguf_conversion.py                 # the embedded model's GGUF
    python benchmarks/gguf_conversion.py --gguf FILE.gguf
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

_CHILD = """
import contextlib, sys, time
from pathlib import Path
from vriksha.loading import gguf_reads, loader
if sys.argv[3] == "without":
    gguf_reads.gguf_parsed_once = contextlib.nullcontext
start = time.perf_counter()
loader._convert_gguf(Path(sys.argv[1]), Path(sys.argv[2]))
print(time.perf_counter() - start)
"""


def _digests(directory: Path) -> dict[str, str]:
    return {
        f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(directory.iterdir()) if f.is_file()
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gguf", default=None, help="the GGUF file (default: the embedded model's)")
    args = parser.parse_args()

    from vriksha.engine.platform.cpu_features import cpu_features
    from vriksha.loading.loader import default_gguf_path

    gguf = Path(args.gguf) if args.gguf else default_gguf_path()
    seconds, files = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for how in ("parsed once", "without"):
            out = Path(tmp) / how.replace(" ", "-")
            done = subprocess.run(
                [sys.executable, "-c", _CHILD, str(gguf), str(out), how.split()[0]],
                capture_output=True,
                text=True,
                check=True,
            )
            seconds[how] = float(done.stdout.strip().splitlines()[-1])
            files[how] = _digests(out)
    print(f"cpu: {cpu_features().summary()}")
    print(
        f"{gguf.name}: parsed once {seconds['parsed once']:.1f} s, Transformers alone {seconds['without']:.1f} s "
        f"({seconds['without'] / seconds['parsed once']:.2f}x); files identical: {files['parsed once'] == files['without']}"
    )


if __name__ == "__main__":
    main()
