"""The reranker pool: a broker (``python -m daemons.reranker``) in front of cross-encoder worker processes."""
