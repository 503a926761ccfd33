"""`vriksha router --config ROUTES.yaml`: the routes file checked, the embedding model and the classifier
heads loaded, the fleet pools' replicas started, before the server binds (a bad file or a missing model
stops it with the reason). `app.state.close()` stops those replicas; the router calls it on exit."""

from __future__ import annotations

import logging

from fastapi import FastAPI

from vriksha.router.config import RouterConfig

logger = logging.getLogger(__name__)


def semantic_app(path: str, base: RouterConfig) -> FastAPI:
    from vriksha.semantic.app import create_semantic_app
    from vriksha.semantic.classify import RouteClassifier
    from vriksha.semantic.config import load_routes
    from vriksha.semantic.embedder import embedder_for
    from vriksha.semantic.fleets import PoolFleets

    cfg = load_routes(path)
    embedder = embedder_for(cfg)
    classifier = RouteClassifier(cfg, embedder)
    fleets = PoolFleets(cfg, base.api_key)
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
