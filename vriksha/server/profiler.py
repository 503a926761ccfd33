"""`POST /start_profile` and `/stop_profile`: a torch.profiler capture of every thread (the engine loop runs in
its own thread), written as gzip'd Chrome traces to the configured directory."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from vriksha.profiling.capture import TRACE_SUFFIX, all_threads_config
from vriksha.server.errors import ConflictError

logger = logging.getLogger(__name__)


class ServerProfiler:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._prof: profile | None = None
        self._started_at = 0.0

    @property
    def running(self) -> bool:
        return self._prof is not None

    def start(
        self, record_shapes: bool = False, profile_memory: bool = False, with_stack: bool = False
    ) -> Path:
        if self._prof is not None:
            raise ConflictError("a profile is already being recorded; POST /stop_profile first")
        self.directory.mkdir(parents=True, exist_ok=True)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        kwargs = {}
        cfg = all_threads_config()
        if cfg is not None:
            kwargs["experimental_config"] = cfg
        prof = profile(
            activities=acts,
            record_shapes=record_shapes,
            profile_memory=profile_memory,
            with_stack=with_stack,
            **kwargs,
        )
        prof.start()
        self._prof = prof
        self._started_at = time.time()
        logger.info("profiler started; traces go to %s", self.directory)
        return self.directory

    async def stop(self) -> Path:
        prof = self._prof
        if prof is None:
            raise ConflictError("no profile is being recorded; POST /start_profile first")
        self._prof = None
        prof.stop()
        path = (
            self.directory / f"server_rank0_{time.strftime('%Y%m%d-%H%M%S', time.gmtime(self._started_at))}"
        )
        n = 0
        while (out := Path(f"{path}_{n}{TRACE_SUFFIX}")).exists():
            n += 1
        await asyncio.to_thread(prof.export_chrome_trace, str(out))
        logger.info("wrote profiler trace %s", out)
        return out
