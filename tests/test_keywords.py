"""Tests for daemons.lib.keywords (SPEC section 1 keyword column, section 2 keyword query)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from daemons.lib.keywords import (
    MAX_TOKEN_REPEATS,
    PRONOUNS,
    STOP_WORDS,
    content_words,
    file_keyword_text,
    identifiers,
    keyword_text,
    query_keywords,
    split_identifier,
)


@pytest.mark.parametrize(
    "ident,parts",
    [("fetchModelEmbedding", ["fetch", "model", "embedding"]),
     ("MAX_FILE_BYTES", ["max", "file", "bytes"]),
     ("snake_case_name", ["snake", "case", "name"]),
     ("PascalCase", ["pascal", "case"]),
     ("HTTPServer", ["http", "server"]),
     ("parseJSON2Html", ["parse", "json", "2", "html"]),
     ("XMLHttpRequest", ["xml", "http", "request"]),
     ("getURLs", ["get", "urls"]),
     ("sha256sum", ["sha", "256", "sum"]),
     ("__init__", ["init"]),
     ("x", ["x"]),
     ("ÄpfelBaum", ["äpfel", "baum"]),
     ("___", [])],
)
def test_split_identifier(ident: str, parts: list[str]) -> None:
    """Identifiers split on underscores, case humps, acronym ends and digits, lower-cased."""
    assert split_identifier(ident) == parts


def test_identifiers_finds_words_in_code() -> None:
    """Identifier extraction keeps letter/underscore-led words and skips numbers and '_' alone."""
    assert identifiers("x1 = foo.bar_baz(42, _, größe)") == ["x1", "foo", "bar_baz", "größe"]


def test_keyword_text_matches_spec_examples() -> None:
    """The SPEC examples give the whole identifier followed by its parts."""
    assert keyword_text("fetchModelEmbedding", "") == "fetchmodelembedding fetch model embedding"
    assert keyword_text("MAX_FILE_BYTES", "") == "max_file_bytes max file bytes"
    assert keyword_text("", "src/auth/tokenStore.ts") == "src auth tokenstore token store ts"


def test_keyword_text_code_then_path_and_single_part_words() -> None:
    """Code identifiers come first in order, one-part words alone, then the path words."""
    out = keyword_text("def load(path): return _cache[path]", "lib/io.py")
    assert out == "def load path return _cache cache path lib io py"


def test_keyword_text_caps_repeats() -> None:
    """Repeated identifiers are kept for term frequency but capped per token."""
    out = keyword_text("retryCount " * 20, "a.py").split()
    assert out.count("retrycount") == MAX_TOKEN_REPEATS
    assert out.count("retry") == MAX_TOKEN_REPEATS
    assert out.count("py") == 1


def test_file_keyword_text_is_the_whole_file_without_a_repeat_cap() -> None:
    """The whole-file text joins the chunks in order and keeps every repeat, path words once at the end."""
    out = file_keyword_text(["retryCount = 1\n" * 10, "retryCount += 1\n" * 10], "net/retry.py").split()
    assert out.count("retrycount") == 20 and out.count("count") == 20
    assert out[-3:] == ["net", "retry", "py"]


def test_stop_words_keep_code_words() -> None:
    """Stop words hold English and question words but not common code identifiers."""
    for w in ("the", "where", "how", "what", "which", "does", "is", "it"):
        assert w in STOP_WORDS
    for w in ("file", "function", "class", "type", "test", "error", "config", "get", "return"):
        assert w not in STOP_WORDS
    assert PRONOUNS <= STOP_WORDS


def test_query_keywords_drops_stop_words_and_splits() -> None:
    """The question is treated like code: stop words dropped, identifiers whole and split."""
    assert query_keywords("Where is the retry logic?") == "retry logic"
    assert query_keywords("how does fetchModelEmbedding work") == (
        "fetchmodelembedding fetch model embedding work")


def test_query_keywords_dotted_names_dedup_and_code_like_stop_words() -> None:
    """Dotted names split on dots, tokens are deduplicated, and code-like words survive."""
    assert query_keywords("where is os.path.join used? os.path imported") == (
        "os path join used imported")
    assert query_keywords("what calls `this` and isValid") == "calls this isvalid valid"


def test_content_words_for_follow_up_rule() -> None:
    """Content words are the non-stop words, lowercased and deduplicated."""
    assert content_words("and how is it tested?") == ["tested"]
    assert content_words("Where is the Config parsed, the config?") == ["config", "parsed"]


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200), st.text(max_size=50))
def test_keyword_functions_never_raise(text: str, path: str) -> None:
    """Any text gives lower-case keyword strings without raising."""
    for out in (keyword_text(text, path), query_keywords(text)):
        assert out == out.lower() or not out.isascii()
    assert all(w not in STOP_WORDS for w in content_words(text))
