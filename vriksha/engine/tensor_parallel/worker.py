"""A tensor-parallel rank other than 0: load the model, keep this rank's shard, then run every step rank 0
broadcasts until it says stop. It holds its share of every KV slot and no scheduler; a failure is written to
the rendezvous store for rank 0 to report, and the process exits when rank 0 does."""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback

import torch
import torch.distributed as dist

import vriksha.device as devices
from vriksha.engine.config import EngineConfig
from vriksha.engine.platform import host_malloc
from vriksha.engine.tensor_parallel.comm import Collectives
from vriksha.engine.tensor_parallel.shard import shard_model
from vriksha.engine.tensor_parallel.step import STOP, unpack

logger = logging.getLogger(__name__)

STORE_HOST = "127.0.0.1"


def _exit_with_parent(parent_pid: int) -> None:
    """Leave as soon as rank 0's process is gone (killed before it could stop this one)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="vriksha-tp-parent", daemon=True).start()


def main(
    rank: int, size: int, config: dict, port: int, threads: int, parent_pid: int, timeout_s: float
) -> None:
    logging.basicConfig(level=logging.WARNING, format=f"[tp rank {rank}] %(levelname)s %(name)s: %(message)s")
    _exit_with_parent(parent_pid)
    store = dist.TCPStore(STORE_HOST, port, size, is_master=False, timeout=_seconds(timeout_s))
    try:
        _serve(rank, size, EngineConfig.from_dict(config), store, threads, timeout_s)
    except BaseException as exc:  # noqa: BLE001 - reported to rank 0, then the process ends
        logger.error("rank %d failed: %s", rank, traceback.format_exc())
        try:
            store.set(f"error/{rank}", f"{type(exc).__name__}: {exc}")
        except Exception:  # noqa: BLE001 - rank 0 (the store's host) is gone
            pass
        os._exit(1)


def _seconds(s: float):
    import datetime

    return datetime.timedelta(seconds=s)


def _serve(
    rank: int, size: int, config: EngineConfig, store: dist.Store, threads: int, timeout_s: float
) -> None:
    from vriksha.engine.attention.layout_probe import probe_kv_layout
    from vriksha.engine.core.kv_pool import KVPool, ReqToTokenTable, kv_slots
    from vriksha.engine.platform import compute_dtype
    from vriksha.engine.platform import plan as platform_plan
    from vriksha.engine.runner.model_runner import ModelRunner
    from vriksha.engine.runner.step import ForwardStep, StepInputs
    from vriksha.loading import load_model

    device = devices.local_device(rank, config.device)
    if devices.is_host(device):
        torch.set_num_threads(threads)
        host_malloc.keep_freed_memory(config.platform.host_malloc_tuning)
    model = load_model(config.model, dtype=config.dtype, device=device).model
    store.set(f"loaded/{rank}", "1")
    comm = Collectives(store, rank, size, device, timeout_s)
    shard_model(model, rank, size, comm.all_reduce)
    given = compute_dtype.given(next(model.parameters()).dtype, device, requested=config.dtype)
    plan = platform_plan.resolve(config, model, given, tensor_parallel=True)
    layout = probe_kv_layout(model)  # a forward pass: a collective, in step with every rank
    slots = comm.min_int(kv_slots(config, device, layout, plan.kv_dtype))
    pool = KVPool(layout, slots, plan.kv_dtype, device)
    runner = ModelRunner(model, pool, ReqToTokenTable(1, 1, device), config, plan)
    no_rows = torch.empty(0, dtype=torch.int64, device=device)  # rank 0 alone computes logits
    logger.info("rank %d ready: %d KV slots", rank, slots)
    while True:
        message = comm.receive()
        if message.kind == STOP:
            break
        input_ids, position_ids, attn = unpack(message, pool, device, runner.attention)
        runner.run(ForwardStep(inputs=StepInputs(input_ids, position_ids, attn, no_rows)))
    comm.close()
