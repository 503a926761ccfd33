"""Adapter-only weight transfer against full weights, per data plane, one run: bytes and seconds per update
from a trainer process to one `vriksha serve`.

For each plane (shm, gloo, fs) one server is started on the model; the trainer pushes the full weights
`--repeats` times, then a LoRA adapter of rank `--ranks` on every linear layer of the decoder (what
`model.lora.rank=R` trains by default) `--repeats` times, each after one warm-up push. Every update is checked:
after a full push the server's sha256 of every parameter equals the trainer's; after an adapter push the
server's sha256 of every adapter tensor equals the trainer's. Bytes: what crossed the data plane
(`bytes_moved`) and what the sender copied (`bytes_copied`); seconds: the whole update as the trainer sees it
(start, transfer, finish: for an adapter, the server's merge of it into its weights included).

    python benchmarks/lora_transfer.py                             # the embedded model, rank 16, every plane
    python benchmarks/lora_transfer.py --models tiny --repeats 2   # a smoke run
    python benchmarks/lora_transfer.py --ranks 8,16,64 --planes shm
    python benchmarks/lora_transfer.py --models qwen2.5-coder-0.5b-instruct --planes shm,gloo   # after `make models`
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.weight_sync import build, check, perturb  # noqa: E402

PLANES = ("shm", "gloo", "fs")


def random_adapter(model: torch.nn.Module, rank: int, step: int):
    """An adapter on every linear layer of the decoder, as training leaves it (B away from zero)."""
    from vriksha.lora import LoraAdapter, LoraWeights

    g = torch.Generator().manual_seed(step)
    modules = {}
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and name.startswith("model.layers."):
            out_f, in_f = m.weight.shape
            a = torch.randn(rank, in_f, generator=g) / in_f**0.5
            modules[name] = LoraWeights(a, torch.randn(out_f, rank, generator=g) * 1e-3)
    suffixes = tuple(sorted({n.rsplit(".", 1)[-1] for n in modules}))
    return LoraAdapter("bench", rank, 2.0 * rank, suffixes, modules)


def check_adapter(client, adapter) -> None:
    from vriksha.weights import digest

    served = client.digests()
    if any(served.get(k) != digest(t) for k, t in adapter.peft_state_dict().items()):
        raise SystemExit("the adapter on the server differs from the trainer's after an update")


def timed(push, repeats: int) -> tuple[list[float], object]:
    times, last = [], None
    for i in range(repeats + 1):  # the first update warms buffers and mappings
        t0 = time.perf_counter()
        last = push(i)
        if i:
            times.append(time.perf_counter() - t0)
    return times, last


def run_plane(plane: str, model, model_dir, ranks: list[int], args, tmp: Path) -> list[dict]:
    from tests.server.conftest import ServerProcess
    from vriksha.weights import WeightSyncClient

    server_args = ["--kv-cache-memory-gb", "0.1"] + (["--model", str(model_dir)] if model_dir else [])
    server = ServerProcess(server_args, tmp / f"server-{plane}.log")
    rows = []
    version = [0]

    def next_version() -> int:
        version[0] += 1
        return version[0]

    try:
        client = WeightSyncClient(
            server.base_url, f"bench-{plane}", backend=plane, bucket_bytes=64 << 20, fs_root=tmp / "fs"
        )
        try:
            client.connect()

            def full(i: int):
                perturb(model, i)
                result = client.push(model, version=next_version())
                check(client, model)
                return result

            times, last = timed(full, args.repeats)
            rows.append({"what": "full", "rank": None, "seconds": times, "sender": last.sender})
            for rank in ranks:

                def adapter_push(i: int, rank: int = rank):
                    adapter = random_adapter(model, rank, i)
                    result = client.push_adapter(adapter, version=next_version())
                    check_adapter(client, adapter)
                    return result

                times, last = timed(adapter_push, args.repeats)
                rows.append({"what": "adapter", "rank": rank, "seconds": times, "sender": last.sender})
        finally:
            client.close()
    finally:
        server.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--models", default="embedded", help="comma list of embedded, 2gb, tiny or a packaged model's name"
    )
    ap.add_argument("--planes", default=",".join(PLANES), help="comma list of " + ", ".join(PLANES))
    ap.add_argument("--ranks", default="16", help="comma list of adapter ranks")
    ap.add_argument("--repeats", type=int, default=3, help="timed updates of each kind (after one warm-up)")
    ap.add_argument("--out", default="benchmarks/results/lora_transfer.json", help="where the JSON goes")
    args = ap.parse_args()
    from vriksha.net.trust import WEIGHTS_KEY_ENV, new_key

    os.environ.setdefault(WEIGHTS_KEY_ENV, new_key())
    ranks = [int(r) for r in args.ranks.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="vriksha-lora-transfer-") as tmp_s:
        tmp = Path(tmp_s)
        for name in args.models.split(","):
            model, model_dir = build(name, tmp)
            for plane in args.planes.split(","):
                for row in run_plane(plane, model, model_dir, ranks, args, tmp):
                    results.append({"model": name, "plane": plane, **row})
                    print(
                        f"{name} {plane} {row['what']} {row['rank']}: {statistics.median(row['seconds']):.3f} s"
                    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"load_before": os.getloadavg()[0], "results": results}, indent=2))
    print("\n| model | plane | update | bytes moved | of the full push | s/update (median) |")
    print("|---|---|---|---|---|---|")
    for r in results:
        full = next(
            x for x in results if x["model"] == r["model"] and x["plane"] == r["plane"] and x["rank"] is None
        )
        moved, whole = r["sender"]["bytes_moved"], full["sender"]["bytes_moved"]
        what = "full weights" if r["rank"] is None else f"adapter, rank {r['rank']}"
        print(
            f"| {r['model']} | {r['plane']} | {what} | {moved / 2**20:.2f} MiB | {100 * moved / whole:.2f}% | "
            f"{statistics.median(r['seconds']):.3f} |"
        )


if __name__ == "__main__":
    main()
