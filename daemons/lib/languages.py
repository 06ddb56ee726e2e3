"""Which tree-sitter grammar a file gets, and the cached parsers (SPEC section 1).

Every language name here loads offline with the pinned tree-sitter-language-pack (checked by the
tests). Parsers are cached one per thread, since a ``tree_sitter.Parser`` is not thread-safe.
"""
from __future__ import annotations

import threading
import time
from functools import lru_cache
from pathlib import PurePosixPath
from typing import Any

__all__ = ["EXTENSION_LANGUAGES", "FILENAME_LANGUAGES", "NO_GRAMMAR_LANGUAGES", "get_parser", "language_for_path", "parse"]

#: File extension (lower case, with dot) -> tree-sitter-language-pack name.  Every name here
#: loads offline with the pinned tree-sitter-language-pack (checked by the tests).
EXTENSION_LANGUAGES: dict[str, str] = {
    ".py": "python", ".pyi": "python", ".pyw": "python",
    ".ts": "typescript", ".mts": "typescript", ".cts": "typescript",
    ".tsx": "tsx",
    ".js": "javascript", ".jsx": "javascript", ".mjs": "javascript", ".cjs": "javascript",
    ".go": "go",
    ".rs": "rust",
    ".java": "java",
    ".c": "c", ".h": "c",
    ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".c++": "cpp",
    ".hpp": "cpp", ".hh": "cpp", ".hxx": "cpp", ".h++": "cpp",
    ".rb": "ruby", ".rake": "ruby", ".gemspec": "ruby",
    ".md": "markdown", ".markdown": "markdown",
    ".sh": "bash", ".bash": "bash", ".zsh": "bash",
    ".css": "css", ".scss": "scss",
    ".html": "html", ".htm": "html",
    ".json": "json",
    ".yaml": "yaml", ".yml": "yaml",
    ".toml": "toml",
    ".kt": "kotlin", ".kts": "kotlin",
    ".php": "php",
    ".cs": "csharp",
    ".scala": "scala", ".sc": "scala",
    ".swift": "swift",
    ".lua": "lua",
    ".sql": "sql",
    ".hs": "haskell",
    ".ex": "elixir", ".exs": "elixir",
    ".dart": "dart",
    ".r": "r",
    ".zig": "zig",
    ".ml": "ocaml",
    ".pl": "perl", ".pm": "perl",
    ".vue": "vue",
    ".svelte": "svelte",
    ".jl": "julia",
    ".clj": "clojure", ".cljs": "clojure", ".cljc": "clojure",
    ".elm": "elm",
    ".erl": "erlang", ".hrl": "erlang",
    ".groovy": "groovy", ".gradle": "groovy",
    ".tf": "hcl", ".hcl": "hcl",
    ".nix": "nix",
    ".proto": "proto",
    ".cmake": "cmake",
}

#: Exact file names (lower case) -> language name.
FILENAME_LANGUAGES: dict[str, str] = {
    "dockerfile": "dockerfile",
    "makefile": "make", "gnumakefile": "make",
    "cmakelists.txt": "cmake",
    "rakefile": "ruby", "gemfile": "ruby",
}

#: Languages that are reported on chunks but cut by the blank-line/heading splitter.
NO_GRAMMAR_LANGUAGES: frozenset[str] = frozenset({"markdown"})

def language_for_path(path: str) -> str | None:
    """Return the tree-sitter-language-pack name for ``path`` (by file name, then extension),
    or ``None`` when no grammar is mapped.  Never raises."""
    try:
        name = PurePosixPath(str(path).replace("\\", "/")).name.lower()
    except Exception:  # pragma: no cover - defensive
        return None
    if name in FILENAME_LANGUAGES:
        return FILENAME_LANGUAGES[name]
    if name.startswith("dockerfile."):
        return "dockerfile"
    dot = name.rfind(".")
    if dot <= 0 and not name.startswith("."):
        return None
    return EXTENSION_LANGUAGES.get(name[dot:]) if dot >= 0 else None


_local = threading.local()


@lru_cache(maxsize=None)
def _language(language: str) -> Any:
    from tree_sitter_language_pack import get_language

    return get_language(language)  # type: ignore[arg-type]


def get_parser(language: str) -> Any:
    """Return a cached ``tree_sitter.Parser`` for ``language`` (one per thread, since parsers are
    not thread-safe).  Raises ``LookupError`` (or the pack's error) for an unknown language."""
    cache: dict[str, Any] = getattr(_local, "parsers", None) or {}
    _local.parsers = cache
    parser = cache.get(language)
    if parser is None:
        import tree_sitter

        parser = tree_sitter.Parser(_language(language))
        cache[language] = parser
    return parser


#: CPU milliseconds a grammar may spend parsing one file before the file is split as plain text
#: (a pathological file, such as 40,000 nested HTML tags, takes tree-sitter seconds; ordinary
#: source files of a megabyte take about 100 ms). CPU time of the parsing thread, so a loaded
#: machine does not push files over it. 0: no limit.
PARSE_TIME_LIMIT_MS = 2000


class GrammarTimeLimit(Exception):
    """The grammar used up its time limit on one file (``parse``)."""


def parse(text: str, language: str, time_limit_ms: int = 0) -> Any | None:
    """Parse ``text`` with ``language``'s grammar; return the ``tree_sitter.Tree`` or ``None``
    when the language is unknown/unloadable or parsing fails. With *time_limit_ms*, a parse
    that uses more CPU time than that in this thread is cancelled and ``GrammarTimeLimit`` is
    raised; nothing else raises."""
    try:
        parser = get_parser(language)
        data = text.encode("utf-8", "surrogatepass")
    except Exception:
        return None
    if not time_limit_ms:
        try:
            return parser.parse(data)
        except Exception:
            return None
    cut = time.thread_time() + time_limit_ms / 1000
    over = False

    def cancel(*_: Any) -> bool:  # called by tree-sitter as it goes; True cancels the parse
        nonlocal over
        over = time.thread_time() > cut
        return over

    try:
        # a progress callback is honoured only when the source comes through a read callback
        return parser.parse(lambda offset, _point: data[offset:offset + 65536], progress_callback=cancel)
    except Exception:
        if over:
            parser.reset()
            raise GrammarTimeLimit(f"the grammar's time limit ({time_limit_ms} ms) was reached") from None
        return None
