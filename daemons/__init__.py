"""wsctx's daemons, one package each (``python -m daemons.<name>``), and the shared ``lib``."""

#: Every daemon, in the order ``wsctx up`` starts them and status lists them.
DAEMONS = ("watcher", "chunker", "embedder", "searcher", "reranker", "front")
