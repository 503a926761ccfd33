"""`python -m vriksha.engine.tensor_parallel SPEC`: one rank > 0 of a tensor-parallel engine (started by rank 0;
SPEC is the JSON of `worker.main`'s arguments)."""

import json
import sys

from vriksha.engine.tensor_parallel.worker import main

main(**json.loads(sys.argv[1]))
