"""Settings: SPEC defaults, overridden by a TOML file, overridden by ``WSCTX_*`` environment variables.

The TOML file is ``$WSCTX_CONFIG`` or ``~/.config/wsctx/config.toml``; its keys are the field names
of the sections below (``SECTIONS``), flat or under any table (``[reranking] rerank_threshold = 0.1``). An environment
variable is the field name upper-cased with the ``WSCTX_`` prefix (``WSCTX_RERANK_THRESHOLD``);
lists are comma-separated. Fields in ``INDEX_SHAPING`` change how rows are built: changing one
means a rebuild, which the embedder detects and reports instead of mixing rows.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterable, Mapping
from typing import Any, get_type_hints

from daemons.lib.assembly import BUDGET_CHARS, MAX_BLOCK_CHARS, NEAR_MISS_COUNT, RERANK_THRESHOLD, SNIPPET_COUNT
from daemons.lib.chunking import DEFAULT_SETTINGS as CHUNK_DEFAULTS, ChunkSettings
from daemons.lib.fusion import (
    BOTH, FILE_BM25, FILE_KEYWORD, FILE_KEYWORD_POOL, FILE_LISTS, FOCUS_K, KEYWORD, KEYWORD_K, LIST_WEIGHTS, MENTIONED, TESTED,
    TRACEBACK, TRACEBACK_LIST_WEIGHTS, kind_weights,
    RERANK_FUSION_K, RERANK_FUSION_WEIGHT, RERANK_TOP, RERANK_TOP_LONG, RRF_K, VECTOR, VECTOR_K,
)
from daemons.lib.widening import IMPORTS_MAX_CHARS, WIDEN_MAX_CHARS
from daemons.lib.pipeline import RERANK_FUSION_K_LONG, RERANK_FUSION_WEIGHT_LONG
from daemons.lib.windows import WINDOW_CHARS, WINDOW_OVERLAP
from daemons.lib.echoes import QUESTION_COPY_WEIGHT
from daemons.lib.filtering import bad_glob
from daemons.lib.roles import CONFIG_WEIGHT, DOC_WEIGHT, TEST_WEIGHT, VENDORED_WEIGHT
from daemons.lib.question import DENSE_MAX_WINDOWS, DENSE_QUERIES, KEYWORD_MAX_TERMS, RERANK_QUERY_CHARS, WHOLE
from models.batching import BATCH_MAX, BATCH_TOKENS

APP = "wsctx"
#: ``ranking`` values: the settings chosen on validation cases, or SPEC §2's ranking.
TUNED, SPEC = "tuned", "spec"
RANKINGS = (TUNED, SPEC)


#: Where systemd puts each user's runtime folder (``XDG_RUNTIME_DIR`` is ``<this>/<uid>`` there).
SYSTEMD_RUNTIME_ROOT = Path("/run/user")


def _default_runtime_dir() -> str:
    """``$XDG_RUNTIME_DIR/wsctx``; without the variable, the user's systemd runtime folder when it
    exists (a process started with a bare environment, such as an MCP server an agent launches,
    then finds the daemons a login shell started), else ``/tmp/wsctx-<uid>``."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if not xdg and (SYSTEMD_RUNTIME_ROOT / str(os.getuid())).is_dir():
        xdg = str(SYSTEMD_RUNTIME_ROOT / str(os.getuid()))
    return str(Path(xdg) / APP) if xdg else f"/tmp/{APP}-{os.getuid()}"


def _default_data_dir() -> str:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return str(Path(base) / APP)


def _default_pool_size() -> int:
    return max(1, min(3, (os.cpu_count() or 1) // 4))


#: LanceDB's caches of index pages and of table metadata, in MB, shared by every table a process
#: opens (``store.configure_caches``). LanceDB's own defaults, 6 GiB and 1 GiB, let a long-running
#: daemon grow with every write: each write and each optimize makes a new table version whose
#: manifest, fragments and index parts are cached beside the old ones, which nothing reads again
#: (bench/store_memory.py; docs/reliability.md "Soak").
INDEX_CACHE_MB = 64
METADATA_CACHE_MB = 16


# Settings come in sections, one dataclass each, and ``Settings`` is all of them: every field is
# read as ``settings.name`` and set flat in the TOML file or under any table (``[search]`` reads
# best), and each section is the one home of its fields' defaults (module constants where a
# ``lib`` module owns the number). ``SECTIONS`` names them in order.


@dataclass
class Places:
    """Where things live."""

    runtime_dir: str = field(default_factory=_default_runtime_dir)
    data_dir: str = field(default_factory=_default_data_dir)


@dataclass
class Indexing:
    """What gets indexed, and when."""

    max_file_bytes: int = 1_000_000
    include_globs: list[str] = field(default_factory=list)
    exclude_globs: list[str] = field(default_factory=list)
    debounce_ms: int = 300
    reconcile_interval_s: float = 300.0
    # a walk of one workspace stops after this many files and folders, or this many seconds: an
    # endless or enormous tree is indexed as far as the walk got, and nothing it did not reach is
    # deleted (watcher; the next reconcile walks again)
    walk_max_entries: int = 500_000
    walk_max_s: float = 1800.0
    # CPU ms a grammar may take on one file before it is split as plain text (languages.parse; 0: no limit)
    parse_time_limit_ms: int = CHUNK_DEFAULTS.parse_time_limit_ms


@dataclass
class IndexShape:
    """How a file's rows are built (``INDEX_SHAPING``): a change means a rebuild."""

    chunk_max_chars: int = CHUNK_DEFAULTS.max_chars
    chunk_min_chars: int = CHUNK_DEFAULTS.min_chars
    chunk_context_chars: int = CHUNK_DEFAULTS.context_chars
    window_chars: int = WINDOW_CHARS
    window_overlap: int = WINDOW_OVERLAP
    embedder_model: str = "minilm-l6-v2"


@dataclass
class Embedding:
    """The embedder's indexing work."""

    # texts per embedding batch at most, and padded tokens per batch (models.batching: small batches
    # keep onnxruntime's fresh allocations small; 0 tokens: batches of embed_batch, the earlier rule)
    embed_batch: int = BATCH_MAX
    embed_batch_tokens: int = BATCH_TOKENS
    embed_threads: int = 0  # 0: onnxruntime's default (all cores)
    # the nice value indexing runs at (chunker, the embedder's indexing threads), so that questions
    # get the cores first while files are indexed; 0: same priority as questions
    index_nice: int = 10
    # window vectors kept by content (model, text), so a window embedded before is never embedded
    # again: a branch switch or a second copy of a repository costs only its new windows; 0: none
    vector_cache_rows: int = 100_000
    # while more files wait, write a file's rows with their keyword text at once and embed it when
    # nothing waits, so a large workspace is keyword-searchable long before its vectors are built;
    # false: every row is written with its vector (SPEC)
    keywords_first: bool = True
    optimize_every: int = 50  # table writes between compactions / FTS folds


#: ``arrow_memory_pool`` values (``runtime.use_arrow_pool``); '' keeps pyarrow's own, mimalloc.
ARROW_POOLS = ("system", "jemalloc", "mimalloc", "")


@dataclass
class Runtime:
    """Each daemon process's memory and liveness."""

    # LanceDB's caches per process, in MB (store.py; 0: LanceDB's own 6 GiB and 1 GiB, which a
    # long-running daemon fills with the pages of table versions nothing reads again)
    lance_index_cache_mb: int = INDEX_CACHE_MB
    lance_metadata_cache_mb: int = METADATA_CACHE_MB
    # glibc malloc arenas per daemon process (runtime.limit_malloc_arenas; 0: glibc's default, 8 per core)
    malloc_arenas: int = 2
    # blocks of at least this many KB get their own mapping, returned when freed
    # (runtime.fix_mmap_threshold; 0: glibc's threshold, which rises to the largest block freed)
    malloc_mmap_threshold_kb: int = 0
    # Arrow's memory pool per daemon process (runtime.use_arrow_pool: system, jemalloc or mimalloc;
    # '': pyarrow's own, mimalloc, which keeps the pages of the buffers each table write frees)
    arrow_memory_pool: str = "system"
    # the embedder gives malloc's free pages back when it turns idle (runtime.trim_memory): what a
    # model's activations and a table write's buffers freed stays resident otherwise
    trim_when_idle: bool = True
    heartbeat_s: float = 1.0


@dataclass
class Search:
    """How candidates are found and fused: the searcher's, and a question may override most."""

    vector_k: int = VECTOR_K
    keyword_k: int = KEYWORD_K
    focus_k: int = FOCUS_K
    focus_files: int = 8
    rrf_k: int = RRF_K
    # BM25 chunk hits pooled for the file-ranked keyword list (0: no such list; search.py)
    file_keyword_pool: int = FILE_KEYWORD_POOL
    # file-ranked keyword lists fused: "both", "chunks" (pooled chunk hits) or "files" (whole-file BM25; search.py)
    file_list: str = BOTH
    # the files the question names (paths, dotted modules) fused as one more list (mentions.py)
    path_mentions: bool = True
    # the source files that the tests the searches found test, fused as one more list (subjects.py;
    # measured on the validation cases and not adopted: README "Measured and not adopted")
    test_subjects: bool = False
    # "tuned": the ranking settings below as chosen on the validation cases; "spec": SPEC §2's
    # ranking exactly (SPEC_RANKING overrides them: four lists at RRF k=60, no role weights, the
    # whole question for every search, files in cross-encoder probability order)
    ranking: str = TUNED
    # a question is split into prose, code, traceback and error lines, and each search gets the
    # parts that carry most (question.py); off: every search gets the whole question (SPEC §2)
    question_analysis: bool = True
    # keyword terms kept from a long question (question.py)
    keyword_max_terms: int = KEYWORD_MAX_TERMS
    # how a long question's vector is made: whole, condensed, mean or max (question.py)
    dense_query: str = WHOLE
    # texts embedded for one long question (dense_query mean or max)
    dense_windows: int = DENSE_MAX_WINDOWS
    # characters of a long question the cross-encoder reads (question.py)
    rerank_query_chars: int = RERANK_QUERY_CHARS
    # each list's vote in reciprocal rank fusion (fusion.LIST_WEIGHTS; 0 leaves a list out)
    list_weight_vector: float = LIST_WEIGHTS[VECTOR]
    list_weight_keyword: float = LIST_WEIGHTS[KEYWORD]
    list_weight_file_keyword: float = LIST_WEIGHTS[FILE_KEYWORD]
    list_weight_file_bm25: float = LIST_WEIGHTS[FILE_BM25]
    list_weight_mentioned: float = LIST_WEIGHTS[MENTIONED]
    list_weight_tested: float = LIST_WEIGHTS[TESTED]
    # the two file-ranked keyword lists' votes for a question quoting a traceback (fusion.TRACEBACK_LIST_WEIGHTS)
    list_weight_file_keyword_traceback: float = TRACEBACK_LIST_WEIGHTS[FILE_KEYWORD]
    list_weight_file_bm25_traceback: float = TRACEBACK_LIST_WEIGHTS[FILE_BM25]
    # RRF multipliers for test, doc, config and vendored files when the question does not ask for them (roles.py)
    test_weight: float = TEST_WEIGHT
    doc_weight: float = DOC_WEIGHT
    config_weight: float = CONFIG_WEIGHT
    vendored_weight: float = VENDORED_WEIGHT
    # RRF multiplier for a chunk holding the question itself as a string literal (echoes.py)
    question_copy_weight: float = QUESTION_COPY_WEIGHT
    rerank_top: int = RERANK_TOP
    # fused candidates reranked for a long question that quotes no traceback (fusion.RERANK_TOP_LONG)
    rerank_top_long: int = RERANK_TOP_LONG
    embed_timeout_ms: int = 1500


@dataclass
class Reranking:
    """The cross-encoder, its pool, the final order and a question's time budget."""

    rerank_threshold: float = RERANK_THRESHOLD
    near_misses: int = NEAR_MISS_COUNT
    # the final order blends fused rank and cross-encoder rank (fusion.rerank_order)
    rerank_fusion_k: int = RERANK_FUSION_K
    rerank_fusion_weight: float = RERANK_FUSION_WEIGHT
    # the same for a long question (question.Analysis.is_long): the cross-encoder reads its condensed form
    rerank_fusion_k_long: int = RERANK_FUSION_K_LONG
    rerank_fusion_weight_long: float = RERANK_FUSION_WEIGHT_LONG
    reranker_pool_size: int = field(default_factory=_default_pool_size)
    reranker_idle_s: float = 300.0
    reranker_timeout_ms: int = 8000
    reranker_dir: str = ""
    # (question, chunk) scores the broker remembers, so a repeated question costs no rerank (0: none)
    rerank_cache_pairs: int = 50_000
    # a question's time budget in ms from the front's receipt: a stage that cannot finish in what
    # is left is skipped and named (deadline.py); 0: no deadline (SPEC: wait up to the timeouts)
    question_deadline_ms: int = 2000


@dataclass
class Assembly:
    """How the answer's blocks are widened, merged and cut to the budget."""

    widen_max_chars: int = WIDEN_MAX_CHARS
    imports_max_chars: int = IMPORTS_MAX_CHARS
    block_max_chars: int = MAX_BLOCK_CHARS
    snippet_count: int = SNIPPET_COUNT
    budget_chars: int = BUDGET_CHARS


@dataclass
class Network:
    """TCP and team fronts (tcp is opt-in; off loopback it requires CURVE keys)."""

    front_tcp: str = ""
    # a loopback front_tcp without CURVE keys answers every local user (other uids included): only
    # with this set, and then status and log warn (security.py)
    front_tcp_insecure: bool = False
    curve_secret_key_file: str = ""
    curve_authorized_keys_dir: str = ""
    # which workspaces each client key of a CURVE tcp front may ask: ``KEY=WORKSPACE`` entries, KEY
    # the file name (without .key) of the client's public key in curve_authorized_keys_dir or ``*``
    # for every authorised key, WORKSPACE a workspace id or root; none listed: a key sees none
    team_workspaces: list[str] = field(default_factory=list)
    team_fronts: list[str] = field(default_factory=list)
    team_server_key_file: str = ""
    team_timeout_ms: int = 3000


#: The sections in the order ``Settings`` lists their fields, by the TOML table name that reads best.
SECTIONS: dict[str, type] = {
    "places": Places, "indexing": Indexing, "index_shape": IndexShape, "embedding": Embedding, "runtime": Runtime,
    "search": Search, "reranking": Reranking, "assembly": Assembly, "network": Network,
}


# dataclass fields come from the bases in reverse order, so the last section is named first
@dataclass
class Settings(Network, Assembly, Reranking, Search, Runtime, Embedding, IndexShape, Indexing, Places):
    """Every setting of every section, read flat (``settings.rerank_top``)."""

    # ------------------------------------------------------------------ derived

    def endpoint(self, name: str) -> str:
        """The ipc endpoint of socket ``name`` (``front``, ``searcher``, ``embedder.in`` ...)."""
        return f"ipc://{Path(self.runtime_dir) / (name + '.sock')}"

    def control_endpoint(self, daemon: str) -> str:
        return self.endpoint(f"{daemon}.ctl")

    def list_weights(self, traceback: bool = False) -> dict[str, float]:
        """Each fused list's vote by list name, for ``hybrid_search``: a question quoting a
        traceback's (*traceback*) or any other's."""
        return {name: w for name, w in kind_weights(self.kind_list_weights(), traceback).items() if name in LIST_WEIGHTS}

    def rerank_top_for(self, long: bool, traceback: bool) -> int:
        """How many fused candidates a question goes on to the cross-encoder with:
        ``rerank_top_long`` for a *long* question that quotes no *traceback*, else ``rerank_top``."""
        return self.rerank_top_long if long and not traceback else self.rerank_top

    def kind_list_weights(self) -> dict[str, float]:
        """Each list's vote, and each ``<name>_traceback`` vote (``fusion.kind_weights`` picks)."""
        return {**{name: float(getattr(self, f"list_weight_{name}")) for name in LIST_WEIGHTS},
                **{name + TRACEBACK: float(getattr(self, f"list_weight_{name}{TRACEBACK}")) for name in TRACEBACK_LIST_WEIGHTS}}

    def index_shape(self) -> dict[str, Any]:
        """The settings that shaped the rows; recorded in the table and compared on open."""
        return {k: getattr(self, k) for k in INDEX_SHAPING}

    def chunk_settings(self) -> ChunkSettings:
        """How the chunker cuts a file with these settings (its sizes and the grammar's time limit)."""
        return ChunkSettings(self.chunk_max_chars, self.chunk_min_chars, self.chunk_context_chars, self.parse_time_limit_ms)


#: What ``ranking = "spec"`` sets: SPEC §2's ranking (a blend weight far above 1 orders files by
#: cross-encoder probability alone, fusion.rerank_order).
SPEC_RANKING: dict[str, Any] = {
    "rrf_k": 60, "file_keyword_pool": 0, "path_mentions": False, "test_subjects": False, "question_analysis": False,
    "test_weight": 1.0, "doc_weight": 1.0, "config_weight": 1.0, "vendored_weight": 1.0, "question_copy_weight": 1.0,
    "rerank_fusion_weight": 1000.0, "rerank_fusion_weight_long": 1000.0,
    **{f"list_weight_{name}": 1.0 for name in LIST_WEIGHTS},
    **{f"list_weight_{name}{TRACEBACK}": 1.0 for name in TRACEBACK_LIST_WEIGHTS},
}

#: The settings that shape a file's chunks (the chunker's batches carry them, the embedder checks them).
CHUNK_SHAPE = ("chunk_max_chars", "chunk_min_chars", "chunk_context_chars")
#: The settings that shape the index's rows, recorded in the table: a change means a rebuild.
INDEX_SHAPING = tuple(f.name for f in dataclasses.fields(IndexShape))


#: Variables of wsctx that are not settings (each read where it is used); ``WSCTX_FAULT_*`` inject
#: faults in the tests. Any other ``WSCTX_*`` variable is a typo, refused like an unknown key.
OTHER_VARIABLES = frozenset({
    "CONFIG", "PYTHON", "DAEMONS", "EMBEDDER_DIR", "MAX_MESSAGE_BYTES", "RERANKER_WORKER_ID", "RERANKER_BACKEND",
    "MIRROR", "MCP_WORKSPACE", "LOG_LEVEL", "BENCH_CACHE", "ORT_ARENA",
})

#: Inclusive bounds of the numeric settings where a value outside makes no sense (None: open).
RANGES: dict[str, tuple[float | None, float | None]] = {
    "rerank_threshold": (0.0, 1.0), "test_weight": (0.0, 1.0), "doc_weight": (0.0, 1.0), "config_weight": (0.0, 1.0),
    "vendored_weight": (0.0, 1.0), "question_copy_weight": (0.0, 1.0), "rerank_fusion_weight": (0.0, None), "rerank_fusion_weight_long": (0.0, None), "snippet_count": (1, None), "budget_chars": (1, None), "near_misses": (0, None),
    "vector_k": (1, None), "keyword_k": (1, None), "focus_k": (0, None), "focus_files": (0, None), "rrf_k": (1, None),
    "rerank_top": (1, None), "rerank_top_long": (1, None), "file_keyword_pool": (0, None), "max_file_bytes": (1, None), "debounce_ms": (0, None),
    "reconcile_interval_s": (0.1, None), "chunk_max_chars": (1, None), "chunk_min_chars": (0, None), "parse_time_limit_ms": (0, None), "walk_max_entries": (1, None), "walk_max_s": (1, None),
    "chunk_context_chars": (0, None), "window_chars": (1, None), "window_overlap": (0, None), "embed_batch": (1, None), "embed_batch_tokens": (0, None),
    "embed_threads": (0, None), "optimize_every": (1, None), "lance_index_cache_mb": (0, None), "lance_metadata_cache_mb": (0, None), "malloc_arenas": (0, None), "malloc_mmap_threshold_kb": (0, 32768), "embed_timeout_ms": (1, None), "rerank_fusion_k": (0, None), "rerank_fusion_k_long": (0, None),
    "reranker_pool_size": (1, None), "reranker_idle_s": (0.1, None), "reranker_timeout_ms": (1, None),
    "heartbeat_s": (0.01, 60.0), "widen_max_chars": (0, None), "imports_max_chars": (0, None), "block_max_chars": (1, None),
    "team_timeout_ms": (1, None), "index_nice": (0, 19), "vector_cache_rows": (0, None), "rerank_cache_pairs": (0, None), "question_deadline_ms": (0, None),
    "keyword_max_terms": (0, None), "dense_windows": (1, None), "rerank_query_chars": (1, None),
    **{f"list_weight_{name}": (0.0, None) for name in LIST_WEIGHTS},
    **{f"list_weight_{name}{TRACEBACK}": (0.0, None) for name in TRACEBACK_LIST_WEIGHTS},
}


def check_range(name: str, value: float) -> str:
    """"" when ``value`` is allowed for setting ``name``, else why not (with the valid range)."""
    lo, hi = RANGES.get(name, (None, None))
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        if hi is None:
            return f"{name} must be at least {lo:g}, not {value:g}"
        return f"{name} must be between {lo:g} and {hi:g}, not {value:g}"
    return ""


def question_settings_problem(threshold: float | None, snippet_count: int | None, budget_chars: int | None,
                              deadline_ms: int | None = None) -> tuple[str, str]:
    """``(setting, why)`` for the first out-of-range value a single question sets for itself
    (``wsctx ask --threshold/--snippets/--budget/--deadline``, a request's settings), ``("", "")`` if none."""
    for name, value in (("rerank_threshold", threshold), ("snippet_count", snippet_count), ("budget_chars", budget_chars),
                        ("question_deadline_ms", deadline_ms)):
        problem = check_range(name, value) if value is not None else ""
        if problem:
            return name, problem
    return "", ""


def _suggest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _toml_lines(path: Path, text: str) -> dict[str, str]:
    """``{key: "path:LINE"}`` of each key's first ``key =`` line in the TOML text (tomllib gives no
    positions)."""
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        m = re.match(r"\s*([A-Za-z0-9_-]+)\s*=", line)
        if m:
            out.setdefault(m.group(1), f"{path}:{n}")
    return out


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def _coerce(kind: Any, raw: Any) -> Any:
    if kind in (int, float):
        if isinstance(raw, bool) or (kind is int and isinstance(raw, float)):
            raise ValueError(f"expected {'a whole number' if kind is int else 'a number'}")
        try:
            return kind(raw)
        except (TypeError, ValueError):
            raise ValueError(f"expected {'a whole number' if kind is int else 'a number'}") from None
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        word = str(raw).strip().lower()
        if word not in _TRUE + _FALSE:
            raise ValueError(f"expected one of {', '.join(_TRUE + _FALSE)}")
        return word in _TRUE
    if kind == list[str]:
        if isinstance(raw, str):
            return [p.strip() for p in raw.split(",") if p.strip()]
        return [str(p) for p in raw]
    return str(raw)


def _typed(hints: Mapping[str, Any], key: str, raw: Any, where: str, known: Iterable[str]) -> Any:
    """``raw`` as setting ``key``'s type; ValueError naming *where* for an unknown key (with the
    closest of *known*) or a value of the wrong type."""
    if key not in hints:
        raise ValueError(f"{where}: unknown setting {key!r}{_suggest(key, known)}")
    try:
        return _coerce(hints[key], raw)
    except ValueError as exc:
        raise ValueError(f"{where}: {key} = {raw!r}: {exc}") from None


def _flatten(doc: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if isinstance(value, dict):
            out.update(_flatten(value))
        else:
            out[key] = value
    return out


def load_settings(config_file: str | None = None, env: dict[str, str] | None = None, **overrides: Any) -> Settings:
    """Build Settings from defaults, the TOML file, the environment and explicit overrides (in that order)."""
    env = os.environ if env is None else env
    hints = get_type_hints(Settings)
    values: dict[str, Any] = {}
    path = Path(config_file or env.get("WSCTX_CONFIG") or Path.home() / ".config" / APP / "config.toml")
    sources: dict[str, str] = {}
    if path.is_file():
        try:
            text = path.read_bytes().decode("utf-8")
            doc = tomllib.loads(text)
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"{path}: not valid TOML: {exc}") from None
        where = _toml_lines(path, text)
        for key, raw in _flatten(doc).items():
            sources[key] = where.get(key, str(path))
            values[key] = _typed(hints, key, raw, sources[key], hints)
    for var in sorted(v for v in env if v.startswith("WSCTX_")):
        name = var[len("WSCTX_"):]
        if name.lower() in hints:
            sources[name.lower()] = f"environment variable {var}"
            try:
                values[name.lower()] = _coerce(hints[name.lower()], env[var])
            except ValueError as exc:
                raise ValueError(f"{var}={env[var]!r}: {exc}") from None
        elif name not in OTHER_VARIABLES and not name.startswith("FAULT_"):
            known = [f"WSCTX_{h.upper()}" for h in hints] + [f"WSCTX_{o}" for o in OTHER_VARIABLES]
            raise ValueError(f"unknown setting in environment variable {var}{_suggest(var, known)}")
    values.update(overrides)
    if values.get("ranking") == SPEC:
        values.update(SPEC_RANKING)
    _check_values(values, sources)
    for key in ("runtime_dir", "data_dir"):
        if key in values:
            values[key] = _absolute_folder(key, values[key], sources.get(key, "setting"))
    settings = Settings(**values)
    problem = combination_problem(settings, sources)
    if problem:
        raise ValueError(problem)
    problem = message_cap_problem(env)
    if problem:
        raise ValueError(problem)
    # ipc paths have a ~107-byte limit; fail early with a clear message rather than at bind time.
    if len(settings.endpoint("reranker.workers")) > 100:
        raise ValueError(f"runtime_dir {settings.runtime_dir!r} is too long for ipc socket paths")
    return settings


def _absolute_folder(key: str, value: str, source: str) -> str:
    """*value* as an absolute path; ValueError for an empty one. A relative folder is taken from
    the current directory once, here, so every daemon and supervisord agree on it."""
    if not str(value).strip():
        raise ValueError(f"{source}: {key} is empty: name a folder (or leave the setting out for the default)")
    return os.path.abspath(os.path.expanduser(str(value)))


#: The largest message cap ``WSCTX_MAX_MESSAGE_BYTES`` may set, and the smallest (a reply's header
#: and a short answer must fit).
MESSAGE_CAP_RANGE = (65_536, 1 << 30)


def message_cap_problem(env: Mapping[str, str]) -> str:
    """Why ``WSCTX_MAX_MESSAGE_BYTES`` in *env* is unusable, or ''."""
    raw = env.get("WSCTX_MAX_MESSAGE_BYTES")
    if raw is None:
        return ""
    lo, hi = MESSAGE_CAP_RANGE
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or not lo <= value <= hi:
        return f"environment variable WSCTX_MAX_MESSAGE_BYTES={raw!r}: must be a whole number of bytes between {lo} and {hi}"
    return ""


def combination_problem(settings: Settings, sources: Mapping[str, str] | None = None) -> str:
    """Why settings that are each in range cannot work together, naming them, or ''.

    - windows must advance: ``window_overlap`` under ``window_chars``;
    - ``chunk_min_chars`` at most ``chunk_max_chars``;
    - a tcp front without CURVE keys only on loopback and only with ``front_tcp_insecure``.
    """
    sources = sources or {}

    def where(key: str) -> str:
        return sources.get(key, "setting")

    if settings.window_overlap >= settings.window_chars:
        return (f"{where('window_overlap')}: window_overlap ({settings.window_overlap}) must be less than "
                f"window_chars ({settings.window_chars}), or no window advances")
    if settings.chunk_min_chars > settings.chunk_max_chars:
        return (f"{where('chunk_min_chars')}: chunk_min_chars ({settings.chunk_min_chars}) must be at most "
                f"chunk_max_chars ({settings.chunk_max_chars})")
    from daemons.lib.security import parse_grants, tcp_problem  # security imports this module

    try:
        parse_grants(settings.team_workspaces)
    except ValueError as exc:
        return f"{where('team_workspaces')}: {exc}"
    if settings.front_tcp:
        problem = tcp_problem(settings)
        if problem:
            return f"{where('front_tcp')}: {problem}"
    return ""


def _check_values(values: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    """ValueError naming the setting and where it came from for the first value out of its range or set of choices."""
    for key, value in values.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{sources.get(key, 'setting')}: {key} must be a finite number, not {value}")
        if key in RANGES and isinstance(value, (int, float)):
            problem = check_range(key, value)
            if problem:
                raise ValueError(f"{sources.get(key, 'setting')}: {problem}")
    for key, choices in (("file_list", FILE_LISTS), ("dense_query", DENSE_QUERIES), ("ranking", RANKINGS), ("arrow_memory_pool", ARROW_POOLS)):
        if key in values and values[key] not in choices:
            raise ValueError(f"{sources.get(key, 'setting')}: {key} {values[key]!r}: use {', '.join(c or repr(c) for c in choices)}")
    for key in ("include_globs", "exclude_globs"):
        problem = bad_glob(values.get(key) or [])
        if problem:
            raise ValueError(f"{sources.get(key, 'setting')}: {key}: {problem}")


#: The settings one question may set for itself (a request's ``settings.overrides``, ``wsctx ask
#: --set``, ``wsctx eval --set``): how candidates are found, fused and ordered. Nothing that shapes
#: the index, names a file or endpoint, or sizes a daemon.
QUESTION_SETTINGS = (
    "ranking", "vector_k", "keyword_k", "rrf_k", "file_keyword_pool", "file_list", "path_mentions", "test_subjects", "question_analysis",
    "keyword_max_terms", "dense_query", "dense_windows", "rerank_query_chars", *(f"list_weight_{name}" for name in LIST_WEIGHTS),
    *(f"list_weight_{name}{TRACEBACK}" for name in TRACEBACK_LIST_WEIGHTS),
    "test_weight", "doc_weight", "config_weight", "vendored_weight", "question_copy_weight", "rerank_top", "rerank_top_long", "rerank_fusion_k", "rerank_fusion_weight",
    "rerank_fusion_k_long", "rerank_fusion_weight_long",
)


#: The most one question may ask of the settings that size its work (its ``settings.overrides``):
#: about ten times the shipped defaults, so a question can look deeper but its cost stays bounded
#: (100,000 of each took 19.6 s and left the next 52 questions without the reranker).
QUESTION_LIMITS: dict[str, float] = {
    "vector_k": 10 * VECTOR_K, "keyword_k": 10 * KEYWORD_K, "file_keyword_pool": 10 * FILE_KEYWORD_POOL,
    "rerank_top": 4 * RERANK_TOP_LONG, "rerank_top_long": 4 * RERANK_TOP_LONG, "dense_windows": 4 * DENSE_MAX_WINDOWS,
    "keyword_max_terms": 8 * KEYWORD_MAX_TERMS, "rerank_query_chars": 20 * RERANK_QUERY_CHARS, "rrf_k": 10_000,
    "rerank_fusion_k": 10_000, "rerank_fusion_k_long": 10_000,
}


def with_overrides(settings: Settings, overrides: Mapping[str, Any], source: str = "question setting") -> Settings:
    """A copy of ``settings`` with one question's own ranking settings (``QUESTION_SETTINGS``).

    Values may be strings (``"0.5"``, from a command line) or already typed. ``ranking`` sets its
    whole preset first (``spec``: ``SPEC_RANKING``; ``tuned``: the shipped defaults of those
    settings), and the other overrides apply on top of it. ValueError names the setting for an
    unknown name, a setting a question may not change, a value of the wrong type or out of range.
    """
    if not overrides:
        return settings
    hints = get_type_hints(Settings)
    values: dict[str, Any] = {}
    for key, raw in overrides.items():
        if key in hints and key not in QUESTION_SETTINGS:
            raise ValueError(f"{source}: {key} cannot be set for one question (only ranking settings can: {', '.join(QUESTION_SETTINGS)})")
        values[key] = _typed(hints, key, raw, source, QUESTION_SETTINGS)
    _check_values(values, {k: source for k in values})
    for key, value in values.items():
        limit = QUESTION_LIMITS.get(key)
        if limit is not None and value > limit:
            raise ValueError(f"{source}: {key} = {value:g} is more than one question may ask (at most {limit:g})")
    preset: dict[str, Any] = {}
    if values.get("ranking") == SPEC:
        preset = dict(SPEC_RANKING)
    elif values.get("ranking") == TUNED:
        shipped = Settings()
        preset = {k: getattr(shipped, k) for k in SPEC_RANKING}
    return dataclasses.replace(settings, **{**preset, **values})
