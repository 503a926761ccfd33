"""Rollouts on `vriksha serve` processes: an `LLM`-shaped `generate` over the native /generate (token ids in,
token ids and log-probs out), and weight pushes under versions after each update.

Versions: the weights a trainer holds after its step k are version k (the initial or resumed weights are
the version of the step they come from). Every /generate answer names the version it was computed under;
an answer from any other version (a server behind, or ahead after a trainer restart) makes the trainer
push its weights again and repeat the request, so no episode is ever trained on from other weights.

Sessions: a request of a session sends its `session_id`, and every session of one family (an episode and its
group's first turn, `session_family`) goes to one server, chosen by hashing the family over the server list (or
to the router, which keeps a session on the replica that holds it); `close_session` posts /close_session there.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import socket
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from vriksha.engine.config import EngineConfig
from vriksha.engine.core.outputs import CompletionOutput, RequestOutput
from vriksha.engine.core.sampling_params import SamplingParams
from vriksha.envs.rollout_engine import SessionIds, TokenPrompt, session_family
from vriksha.errors import VrikshaError
from vriksha.lora import LoraAdapter
from vriksha.net.health import wait_healthy
from vriksha.net.launch import free_port
from vriksha.net.trust import WEIGHTS_KEY_ENV, env_key, new_key
from vriksha.train.config import ModelConfig, RolloutConfig
from vriksha.train.server_recovery import post_until_answered
from vriksha.weights import WeightSyncClient, WeightTransferError, digest

if TYPE_CHECKING:
    from transformers import PreTrainedModel

logger = logging.getLogger(__name__)

__all__ = ["ServerRollout", "WeightVersionError", "start_server"]

STARTUP_TIMEOUT_S = 300.0


def engine_flags(engine: EngineConfig, dtype: str) -> list[str]:
    """`vriksha serve` flags for the options of `rollout.engine` that differ from the defaults."""
    flags = ["--dtype", dtype]
    changed = engine.to_dict(changed_only=True)
    for f in dataclasses.fields(EngineConfig):
        if f.name not in changed or f.name in ("model", "dtype", "device"):
            continue
        name = f.metadata.get("flag") or f.name.replace("_", "-")
        value = changed[f.name]
        if isinstance(value, bool):
            flags.append(f"--{name}" if value else f"--no-{name}")
        elif value is not None:
            flags += [f"--{name}", str(value)]
    return flags


class WeightVersionError(VrikshaError):
    """A server answered under another weight version than the trainer's and could not be re-synced."""


class LocalServer:
    """One `vriksha serve` subprocess on a free loopback port, stopped with the trainer."""

    def __init__(self, model_path: str | None, flags: list[str], log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "vriksha.cli", "serve", "--port", str(self.port)]
        if model_path:
            cmd += ["--model", model_path]
        cmd += flags
        self.log_path = log_path
        self.weights_key = (
            env_key(WEIGHTS_KEY_ENV) or new_key()
        )  # this trainer's alone, unless it was given one
        env = {**os.environ, WEIGHTS_KEY_ENV: self.weights_key}
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        atexit.register(self.stop)
        self._wait()

    def _wait(self) -> None:
        import httpx

        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise VrikshaError(
                    f"the rollout server exited with {self.proc.returncode} at startup:\n{tail}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    logger.info("rollout server at %s (log %s)", self.url, self.log_path)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise VrikshaError(
            f"the rollout server was not healthy after {STARTUP_TIMEOUT_S:.0f} s; see {self.log_path}"
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def start_server(
    model_cfg: ModelConfig,
    engine_module: PreTrainedModel,
    tokenizer: Any,
    engine: EngineConfig,
    out_dir: Path,
) -> LocalServer:
    """A server over the policy's model; a randomly initialised policy is saved first so it has a directory
    (the first push overwrites the weights anyway)."""
    path = model_cfg.path
    if model_cfg.random_init is not None:
        d = out_dir / "server_model"
        engine_module.save_pretrained(d)
        tokenizer.save_pretrained(d)
        path = str(d)
    return LocalServer(path, engine_flags(engine, model_cfg.dtype), out_dir / "server.log")


_NATIVE_FIELDS = (
    "n",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "max_tokens",
    "min_tokens",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "logprobs",
    "include_stop_str_in_output",
    "skip_special_tokens",
)


def native_sampling(params: SamplingParams) -> dict[str, Any]:
    """The native /generate `sampling_params` for engine `SamplingParams` (fields at their defaults left out)."""
    default = SamplingParams()
    out = {}
    for name in _NATIVE_FIELDS:
        value = getattr(params, name)
        if value != getattr(default, name) or name in ("n", "temperature", "max_tokens", "seed"):
            out[name] = value
    return out


def eos_token_ids(module: torch.nn.Module, tokenizer: Any) -> frozenset[int]:
    """The ids that end a completion, as the engine derives them (generation config, then the tokenizer)."""
    ids: set[int] = set()
    gen = getattr(module, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(source)
    return frozenset(ids)


class ServerRollout:
    """A `TrainingEngine` (`rollout_engine.py`) with sessions on servers: `generate` like `LLM.generate`;
    `weights_updated()` and `set_weight_version()` push the engine module to them, or with LoRA
    (`adapter` given) the current adapter alone: the servers keep their base weights and take the adapter's
    tensors in its place (`WeightSyncClient.push_adapter`)."""

    def __init__(
        self,
        cfg: RolloutConfig,
        model_cfg: ModelConfig,
        engine_module: PreTrainedModel,
        tokenizer: Any,
        out_dir: Path,
        rank: int,
        start_version: int,
        adapter: Callable[[], LoraAdapter | None] | None = None,
    ) -> None:
        import httpx

        self.cfg = cfg
        self.adapter = adapter
        self.engine_module = engine_module
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids(engine_module, tokenizer)
        self.rank = rank
        self.out_dir = out_dir
        self.local: LocalServer | None = None
        urls = list(cfg.servers)
        if not urls:
            if rank == 0:
                self.local = start_server(model_cfg, engine_module, tokenizer, cfg.engine, out_dir)
                urls = [self.local.url]
            if dist.is_initialized() and dist.get_world_size() > 1:
                box = [urls]
                dist.broadcast_object_list(box, src=0)
                urls = box[0]
        self.urls = [u.rstrip("/") for u in urls]
        self.http = httpx.Client(timeout=600)
        client_id = f"trainer:{socket.gethostname()}:{out_dir.resolve()}"  # a resumed run is the same trainer
        self.clients = (
            [
                WeightSyncClient(
                    u,
                    client_id,
                    cfg.weight_backend,
                    int(cfg.weight_bucket_mb * 2**20),
                    fs_root=out_dir / "weights",
                    weights_key=self.local.weights_key if self.local is not None else None,
                )
                for u in self.urls
            ]
            if rank == 0
            else []
        )
        self.version = start_version
        self._pushed = False
        self.pushes = 0
        self._pool = ThreadPoolExecutor(max_workers=max(4, 2 * len(self.urls)), thread_name_prefix="rollout")
        self._next = 0

    # -- weights ----------------------------------------------------------

    def weights_updated(self) -> None:
        """Push the engine module's weights under the next version (rank 0), then let every rank go on."""
        if self._pushed:
            self.version += 1
        self._push_all()
        self._pushed = True

    def set_weight_version(self, version: int) -> None:
        """Push the engine module's weights under `version` (off-policy rollouts name the version they load)."""
        if self._pushed and version == self.version:
            return
        self.version = version
        self._push_all()
        self._pushed = True

    def _push_all(self) -> None:
        if self.rank == 0:
            for c in self.clients:
                self._push(c)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()

    def _resync(self) -> None:
        """Push the current weights to every server (rank 0) that serves another version (one restarted)."""
        for c in self.clients:
            wait_healthy(c.base_url, self.cfg.recovery_timeout_s, "rollout server")
            if c.version() != self.version:
                c.reset()  # a restarted server has no transfer; set it up anew
                self._push(c)

    def _push(self, client: WeightSyncClient) -> None:
        try:
            self._push_once(client)
        except WeightTransferError as exc:  # the server died (and is being restarted) or lost its transfer
            logger.warning(
                "weights to %s failed (%s); waiting for it, then pushing again", client.base_url, exc
            )
            wait_healthy(client.base_url, self.cfg.recovery_timeout_s, "rollout server")
            client.reset()
            self._push_once(client)

    def _push_once(self, client: WeightSyncClient) -> None:
        served = client.version()
        expected = self.version - 1 if self._pushed else None
        if expected is None and served != self.version:
            logger.info(
                "server %s is at weight version %d; the trainer starts at %d",
                client.base_url,
                served,
                self.version,
            )
        elif expected is not None and served != expected:
            logger.warning(
                "server %s is at weight version %d, the trainer at %d: re-syncing",
                client.base_url,
                served,
                expected,
            )
        # a server ahead of the trainer (after a trainer restart) takes the trainer's older version on purpose
        rewind = served > self.version
        adapter = self.adapter() if self.adapter is not None else None
        if adapter is not None:
            res = client.push_adapter(adapter, self.version, rewind=rewind)
        else:
            res = client.push(self.engine_module, self.version, rewind=rewind)
        row: dict[str, Any] = {
            "server": client.base_url,
            "version": res.version,
            "backend": res.backend,
            "seconds": res.seconds,
            "sender": res.sender,
            "receiver": res.receiver,
            "server_version_before": served,
        }
        if adapter is not None:
            row["adapter"] = {"name": adapter.name, "rank": adapter.rank, "bytes": adapter.nbytes}
        if self.cfg.verify_weights:
            if adapter is not None:  # the adapter's tensors as the server holds them
                theirs = client.digests()
                mine = {k: digest(t) for k, t in adapter.peft_state_dict().items()}
                row["bit_equal"] = all(theirs.get(k) == v for k, v in mine.items())
            else:
                mine = {n: digest(p) for n, p in self.engine_module.named_parameters()}
                row["bit_equal"] = client.digests() == mine
            if not row["bit_equal"]:
                raise WeightVersionError(
                    f"{client.base_url}: parameters differ from the trainer's after version {self.version}"
                )
        self.pushes += 1
        with open(self.out_dir / "weight_sync.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")

    def flush_cache(self) -> bool:
        """Reset every server's prefix cache (rank 0; the others wait), as `LLM.flush_cache` does in process."""
        import httpx

        ok = True
        if self.rank == 0:
            for url in self.urls:
                try:
                    ok &= self.http.post(f"{url}/reset_prefix_cache").status_code == 200
                except httpx.TransportError:  # a server being restarted: it comes back with an empty cache
                    wait_healthy(url, self.cfg.recovery_timeout_s, "rollout server")
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()
        return ok

    # -- generation -------------------------------------------------------

    def server_of(self, session_id: str | None, i: int = 0) -> str:
        """Where a request goes: the router when there is one; else the server of the session's family, or
        (no session) the next in turn."""
        if self.cfg.router:
            return self.cfg.router.rstrip("/")
        if session_id is None:
            return self.urls[(self._next + i) % len(self.urls)]
        return self.urls[zlib.crc32(session_family(session_id).encode()) % len(self.urls)]

    def _request(
        self, url: str, prompt: TokenPrompt, params: SamplingParams, session_id: str | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "input_ids": list(prompt["prompt_token_ids"]),
            "sampling_params": native_sampling(params),
            "return_text": True,
        }
        if session_id is not None:
            body["session_id"] = session_id
        r = post_until_answered(self.http, f"{url}/generate", body, self.cfg.recovery_timeout_s)
        if r.status_code != 200:
            raise VrikshaError(f"{url}/generate answered {r.status_code}: {r.text[:500]}")
        return r.json()

    def _one(
        self, i: int, prompt: TokenPrompt, params: SamplingParams, session_id: str | None
    ) -> RequestOutput:
        url = self.server_of(session_id, i)
        body = self._request(url, prompt, params, session_id)
        if int(body.get("weight_version", -1)) != self.version:
            raise WeightVersionError(
                f"{url} answered under weight version {body.get('weight_version')} but the trainer is at "
                f"{self.version}"
            )
        outputs = [
            CompletionOutput(
                index=o["index"],
                text=o.get("text") or "",
                token_ids=list(o["token_ids"]),
                token_logprobs=[float(x) for x in o["token_logprobs"]],
                logprobs=None,
                finish_reason=o.get("finish_reason"),
            )
            for o in body["outputs"]
        ]
        return RequestOutput(
            request_id=body["request_id"],
            prompt=None,
            prompt_token_ids=list(prompt["prompt_token_ids"]),
            outputs=outputs,
            finished=True,
            num_cached_tokens=int(body.get("cached_tokens", 0)),
            weight_version=int(body["weight_version"]),
        )

    def generate(
        self,
        prompts: Sequence[TokenPrompt],
        sampling_params: Sequence[SamplingParams],
        use_tqdm: bool = False,
        session_id: SessionIds = None,
    ) -> list[RequestOutput]:
        """`session_id`: the session every prompt (or each) continues, as `LLM.generate` takes it."""
        if session_id is None or isinstance(session_id, str):
            sessions: list[str | None] = [session_id] * len(prompts)
        else:
            sessions = list(session_id)
            if len(sessions) != len(prompts):
                raise VrikshaError(
                    f"got {len(prompts)} prompts but {len(sessions)} session ids; pass one or one each"
                )
        for attempt in range(2):
            futures = [
                self._pool.submit(self._one, i, p, sp, s)
                for i, (p, sp, s) in enumerate(zip(prompts, sampling_params, sessions, strict=True))
            ]
            try:
                outs = [f.result() for f in futures]
                self._next += len(prompts)
                return outs
            except WeightVersionError as exc:
                for f in futures:
                    f.cancel()
                if attempt or self.rank != 0 or (dist.is_initialized() and dist.get_world_size() > 1):
                    raise WeightVersionError(f"{exc}; restart the server or the run") from None
                logger.warning("%s: re-syncing the weights and repeating the rollout", exc)
                self._resync()
        raise AssertionError("unreachable")

    def close_session(self, session_id: str) -> bool:
        """POST /close_session to the session's server (or the router); False when it was not open there or
        the server did not answer (logged: an unclosed session only idles out on the server)."""
        import httpx

        url = self.server_of(session_id)
        try:
            r = self.http.post(f"{url}/close_session", json={"session_id": session_id}, timeout=30)
        except httpx.HTTPError as exc:
            logger.warning("closing session %s on %s failed: %s", session_id, url, exc)
            return False
        if r.status_code != 200:
            logger.warning(
                "closing session %s on %s: answered %d: %s", session_id, url, r.status_code, r.text[:200]
            )
            return False
        return bool(r.json().get("closed", False))

    def close(self) -> None:
        for c in self.clients:
            c.close()
        self.http.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.local is not None:
            self.local.stop()
            self.local = None
