"""structlog configured for one JSON object per line on stdout (supervisord keeps the files)."""
from __future__ import annotations

import logging
import os
import sys

import structlog


def configure(daemon: str) -> structlog.stdlib.BoundLogger:
    """Configure process-wide JSON logging and return a logger bound to ``daemon``."""
    level = getattr(logging, os.environ.get("WSCTX_LOG_LEVEL", "INFO").upper(), logging.INFO)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stdout),
        cache_logger_on_first_use=True,
    )
    return structlog.get_logger().bind(daemon=daemon, pid=os.getpid())
