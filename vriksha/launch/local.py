"""The default launcher: training ranks through torchrun on this node or several (`torchrun.py`), or in this
very process for one rank; a serving fleet as child processes of this host (`vriksha fleet`)."""

from __future__ import annotations

import argparse
import os

from vriksha.launch.protocol import FleetJob, TrainJob
from vriksha.launch.torchrun import run_torchrun


class LocalLauncher:
    name = "torchrun"

    def train(self, job: TrainJob) -> int:
        if job.ranks.distributed and "RANK" not in os.environ:
            return run_torchrun(job.ranks, job.argv)
        from vriksha.train.cli import run_in_process

        return run_in_process(job.config, job.resume, job.profile)

    def fleet(self, job: FleetJob, args: argparse.Namespace) -> int:
        from vriksha.router.fleet import run_local_fleet

        return run_local_fleet(job, args)
