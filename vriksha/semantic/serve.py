"""`vriksha router --config ROUTES.yaml`: the routes file checked, the embedding model and the classifier
heads loaded, the fleet pools' replicas started, before the server binds (a bad file or a missing model
stops it with the reason). `app.state.close()` stops those replicas; the router calls it on exit."""

from __future__ import annotations

import logging

from fastapi import FastAPI

from vriksha.errors import ConfigError
from vriksha.net.trust import INTERNAL_KEY_ENV
from vriksha.router.config import RouterConfig

logger = logging.getLogger(__name__)


def semantic_app(path: str, base: RouterConfig) -> FastAPI:
    from vriksha.router.fleet import fleet_secrets
    from vriksha.semantic.app import create_semantic_app
    from vriksha.semantic.classify import RouteClassifier
    from vriksha.semantic.config import load_routes
    from vriksha.semantic.embedder import embedder_for
    from vriksha.semantic.fleets import PoolFleets

    cfg = load_routes(path)
    listed = [u for p in cfg.pools if p.fleet is None for u in p.replicas]
    if base.internal_key is None and any("," in u for u in listed):
        raise ConfigError(
            f"{path}: replicas with event streams (URL,EVENTS) need their internal key: pass --internal-key or "
            f"set ${INTERNAL_KEY_ENV} to the key they were started with"
        )
    embedder = embedder_for(cfg)
    classifier = RouteClassifier(cfg, embedder)
    secrets: dict[str, str] = {}
    if any(p.fleet is not None for p in cfg.pools):  # the router starts them and shares its keys with them
        secrets = fleet_secrets(base.api_key, base.internal_key)
        base.internal_key = secrets[INTERNAL_KEY_ENV]
    fleets = PoolFleets(cfg, secrets)
    fleets.start()
    try:
        app = create_semantic_app(cfg, classifier, base)
    except BaseException:
        fleets.stop()
        raise
    app.state.close = fleets.stop
    logger.info(
        "routes %s: %d pools, %d decisions, cache %s",
        path,
        len(cfg.pools),
        len(cfg.decisions),
        "on" if cfg.cache.enabled else "off",
    )
    return app
