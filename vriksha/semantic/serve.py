"""`vriksha router --config ROUTES.yaml`: the routes file checked, the embedding model and the classifier
heads loaded, before the server binds (a bad file or a missing model stops it with the reason)."""

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

    cfg = load_routes(path)
    embedder = embedder_for(cfg)
    classifier = RouteClassifier(cfg, embedder)
    logger.info(
        "routes %s: %d pools, %d decisions, cache %s",
        path,
        len(cfg.pools),
        len(cfg.decisions),
        "on" if cfg.cache.enabled else "off",
    )
    return create_semantic_app(cfg, classifier, base)
