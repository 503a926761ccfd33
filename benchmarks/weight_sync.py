"""Weight sync from a trainer process to a `vriksha serve` process, one run: seconds per update and bytes
copied on each side, for each data plane, against the naive way (save a checkpoint, restart the server on it).

Models:
  embedded  SmolLM2-135M-Instruct in fp32 (about 540 MB)
  2gb       a random Llama of the same family, about 2.1 GB in fp32 (hidden 1536, 18 layers)
  tiny      the test model (hidden 64, 2 layers): a smoke run
  NAME      a packaged model by its registry name (`vriksha models list`), e.g. qwen2.5-coder-0.5b-instruct
            (installed with `make models`), in fp32

Data planes: shm (shared memory the engine maps), gloo (a two-member gloo group, packed buckets,
double-buffered), fs (safetensors + a completion marker), reload (save_pretrained, then a new server process
started on the directory until /health answers: what a trainer without weight transfer has to do).

Bytes copied: every explicit copy of tensor data that vriksha's code makes, on each side (packing into a
buffer, serialising to a file, copying into a parameter); copies inside the kernel (socket buffers, page
cache) are not counted. For reload, the sender counts the bytes it serialised and the receiver the bytes
of the state dict it loaded (at least one full copy, plus its model construction).

Every update is checked: after it, the server's sha256 of every parameter equals the trainer's.

    python benchmarks/weight_sync.py                                  # embedded and 2gb, every plane
    python benchmarks/weight_sync.py --models tiny --repeats 2        # a smoke run
    OMP_NUM_THREADS=8 python benchmarks/weight_sync.py --models 2gb --planes shm,gloo --bucket-mb 256
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

MODELS = {
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    ),
    "2gb": dict(
        hidden_size=1536,
        num_hidden_layers=18,
        num_attention_heads=12,
        num_key_value_heads=4,
        intermediate_size=4096,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    ),
}
PLANES = ("shm", "gloo", "fs", "reload")


def build(name: str, out: Path) -> tuple[torch.nn.Module, Path | None]:
    """The trainer's model and a directory a server can load (None: the server's embedded default)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from vriksha.loading import load_model, load_tokenizer, resolve_model_path

    if name == "embedded":
        return load_model(None, dtype=torch.float32).model.eval(), None
    if name not in MODELS:  # a packaged model: the server loads the same converted directory
        path = resolve_model_path(name)
        return load_model(path, dtype=torch.float32).model.eval(), Path(path)
    tok = load_tokenizer(resolve_model_path(None))
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **MODELS[name]
    )
    model = AutoModelForCausalLM.from_config(cfg).eval()
    d = out / name
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return model, d


def perturb(model: torch.nn.Module, step: int) -> None:
    """A stand-in for an optimizer step: every parameter changes."""
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.0 + 1e-4 * ((step % 3) - 1))


def check(client, model: torch.nn.Module) -> None:
    from vriksha.weights import digest

    mine = {n: digest(p) for n, p in model.named_parameters()}
    if client.digests() != mine:
        raise SystemExit("parameters on the server differ from the trainer's after an update")


def run_plane(plane: str, model, model_dir, args, tmp: Path) -> dict:
    from tests.server.conftest import ServerProcess
    from vriksha.weights import WeightSyncClient

    server_args = ["--kv-cache-memory-gb", "0.1"] + (["--model", str(model_dir)] if model_dir else [])
    server = ServerProcess(server_args, tmp / f"server-{plane}.log")
    try:
        if plane == "reload":
            return reload_plane(model, server_args, args, tmp)
        client = WeightSyncClient(
            server.base_url,
            f"bench-{plane}",
            backend=plane,
            bucket_bytes=int(args.bucket_mb * 2**20),
            fs_root=tmp / "fs",
        )
        try:
            client.connect()
            times, last = [], None
            for i in range(args.repeats + 1):  # the first update warms buffers and mappings
                perturb(model, i)
                t0 = time.perf_counter()
                last = client.push(model, version=i + 1)
                if i:
                    times.append(time.perf_counter() - t0)
                check(client, model)
            return {"seconds": times, "sender": last.sender, "receiver": last.receiver}
        finally:
            client.close()
    finally:
        server.stop()


def reload_plane(model, server_args, args, tmp: Path) -> dict:
    from tests.server.conftest import ServerProcess
    from vriksha.loading import load_tokenizer, resolve_model_path
    from vriksha.weights import WeightSyncClient

    tok = load_tokenizer(resolve_model_path(None))
    nbytes = sum(p.nbytes for p in model.parameters())
    times = []
    base = [a for a in server_args if a]
    if "--model" in base:
        i = base.index("--model")
        base = base[:i] + base[i + 2 :]
    for i in range(args.repeats):
        perturb(model, i)
        d = tmp / f"reload-{i}"
        t0 = time.perf_counter()
        model.save_pretrained(d)
        tok.save_pretrained(d)
        server = ServerProcess([*base, "--model", str(d)], tmp / f"server-reload-{i}.log")
        times.append(time.perf_counter() - t0)
        try:
            client = WeightSyncClient(server.base_url, "bench-check")
            check(client, model)
            client.http.close()
        finally:
            server.stop()
    moved = {"bytes_copied": nbytes, "copies": len(list(model.parameters())), "bytes_moved": nbytes}
    return {"seconds": times, "sender": moved, "receiver": moved}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--models",
        default="embedded,2gb",
        help="comma list of embedded, 2gb, tiny or a packaged model's name",
    )
    ap.add_argument("--planes", default=",".join(PLANES), help="comma list of " + ", ".join(PLANES))
    ap.add_argument("--repeats", type=int, default=3, help="timed updates per plane (after one warm-up)")
    ap.add_argument("--bucket-mb", type=float, default=64.0, help="gloo bucket size in MiB")
    ap.add_argument("--out", default="benchmarks/results/weight_sync.json", help="where the JSON goes")
    args = ap.parse_args()
    from vriksha.net.trust import WEIGHTS_KEY_ENV, new_key

    os.environ.setdefault(WEIGHTS_KEY_ENV, new_key())  # the servers' weights key, and the clients'
    results = []
    with tempfile.TemporaryDirectory(prefix="vriksha-wsync-") as tmp_s:
        tmp = Path(tmp_s)
        for name in args.models.split(","):
            model, model_dir = build(name, tmp)
            size = sum(p.nbytes for p in model.parameters())
            for plane in args.planes.split(","):
                r = run_plane(plane, model, model_dir, args, tmp)
                results.append({"model": name, "model_bytes": size, "plane": plane, **r})
                print(f"{name:9s} {plane:7s} {statistics.median(r['seconds']):8.3f} s/update", flush=True)
            del model
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print("\n| model | plane | s/update (median) | vs reload | sender copied | receiver copied |")
    print("|---|---|---|---|---|---|")
    for r in results:
        base = next((x for x in results if x["model"] == r["model"] and x["plane"] == "reload"), None)
        med = statistics.median(r["seconds"])
        speedup = f"{statistics.median(base['seconds']) / med:.1f}x" if base and med > 0 else "-"
        gb = r["model_bytes"]
        print(
            f"| {r['model']} ({gb / 2**20:.0f} MiB) | {r['plane']} | {med:.3f} | {speedup} | "
            f"{r['sender']['bytes_copied'] / gb:.2f} model | {r['receiver']['bytes_copied'] / gb:.2f} model |"
        )


if __name__ == "__main__":
    main()
