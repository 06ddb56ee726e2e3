"""Internal frames between the reranker broker and its workers (never seen outside the pool).

The broker's backend is a ROUTER bound at ``settings.endpoint("reranker.workers")``; each worker
is a DEALER whose routing identity is ``w<seq>`` (``seq`` counts the broker's spawns from 1), so the
broker knows a worker's identity before it speaks. Every message is a multipart::

    [identity]  b"WSRW1"  COMMAND  [job_id]  [json]

(``identity`` exists only on the broker's ROUTER side; ``json`` is a msgspec-encoded JSON object.)

Worker -> broker:
    READY   json {pid, model_id, load_ms}     model loaded, ready for parts
    FAIL    json {pid, reason}                the model could not be loaded; the worker exits
    HB                                        heartbeat, every ``heartbeat_s``
    RESULT  job_id json {scores, ms}          the probabilities of one part, in its order
    ERROR   job_id json {message}             scoring raised; the worker stays available
    BYE     json {reason}                     the worker is leaving (idle, broker gone, signal)

Broker -> worker:
    PART    job_id json {query, passages}     score these (one part at a time per worker)
    HB                                        heartbeat, every ``heartbeat_s``
    STOP                                      finish and exit now

``job_id`` is ``<request msg_id>:<part index>:<attempt>`` so a late RESULT of a part that was
re-dispatched (or of a request that already timed out) is recognised and dropped.
A peer silent for ``LIVENESS`` heartbeat intervals is considered gone (Paranoid Pirate, ZeroMQ
guide ch. 4): the broker drops (and kills) such a worker and re-dispatches its part; a worker
that hears nothing from the broker for ``BROKER_LIVENESS`` intervals exits.
"""
from __future__ import annotations

from typing import Any

import msgspec

MAGIC = b"WSRW1"
READY, FAIL, HB, RESULT, ERROR, BYE = b"READY", b"FAIL", b"HB", b"RESULT", b"ERROR", b"BYE"
PART, STOP = b"PART", b"STOP"

#: Missed heartbeats after which the broker drops a worker.
LIVENESS = 3
#: Missed broker heartbeats after which a worker exits.
BROKER_LIVENESS = 5

_enc = msgspec.json.Encoder()


def pack(obj: dict[str, Any]) -> bytes:
    return _enc.encode(obj)


def unpack(raw: bytes) -> dict[str, Any]:
    out = msgspec.json.decode(raw)
    if not isinstance(out, dict):
        raise ValueError("internal frame json is not an object")
    return out
