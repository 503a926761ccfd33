"""Semantic routing: which pool answers a request (signals, decisions, a semantic cache), in front of the
router that picks a replica inside the pool. See docs/semantic_router.md."""
