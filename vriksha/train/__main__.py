"""`python -m vriksha.train CONFIG ...` and `torchrun --nproc_per_node=N -m vriksha.train CONFIG ...`."""

import sys

from vriksha.train.cli import main

if __name__ == "__main__":
    sys.exit(main())
