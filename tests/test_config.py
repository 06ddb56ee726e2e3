"""Settings errors name the setting and where it came from: the TOML file and line, or the environment variable."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from daemons.lib.config import load_settings, with_overrides
from tests.support import REPO


def test_a_bad_value_names_the_setting_and_its_file_and_line(tmp_path: Path) -> None:
    """A value of the wrong type in the TOML file is refused with the file, the line and the setting."""
    conf = tmp_path / "config.toml"
    conf.write_text("# wsctx\n[search]\nvector_k = 20\nrerank_threshold = \"abc\"\n")
    with pytest.raises(ValueError) as info:
        load_settings(config_file=str(conf), env={})
    assert str(info.value).startswith(f"{conf}:4: rerank_threshold = 'abc': expected a number")


def test_a_bad_environment_value_names_the_variable() -> None:
    """A value of the wrong type in a WSCTX_ variable is refused naming the variable and the value."""
    with pytest.raises(ValueError, match=r"WSCTX_SNIPPET_COUNT='many': expected a whole number"):
        load_settings(config_file="/nonexistent.toml", env={"WSCTX_SNIPPET_COUNT": "many"})


def test_an_unknown_variable_or_key_gets_did_you_mean(tmp_path: Path) -> None:
    """A misspelt WSCTX_ variable is refused like a misspelt TOML key, each with the closest known name."""
    with pytest.raises(ValueError, match=r"unknown setting in environment variable WSCTX_RERANK_TRESHOLD; did you mean 'WSCTX_RERANK_THRESHOLD'\?"):
        load_settings(config_file="/nonexistent.toml", env={"WSCTX_RERANK_TRESHOLD": "0.1"})
    conf = tmp_path / "c.toml"
    conf.write_text("snipet_count = 3\n")
    with pytest.raises(ValueError, match=rf"{conf}:1: unknown setting 'snipet_count'; did you mean 'snippet_count'\?"):
        load_settings(config_file=str(conf), env={})


def test_variables_that_are_not_settings_are_accepted() -> None:
    """WSCTX_CONFIG, WSCTX_DAEMONS, WSCTX_PYTHON and the WSCTX_FAULT_ injections are not settings, and not typos."""
    s = load_settings(config_file="/nonexistent.toml", env={"WSCTX_DAEMONS": "front", "WSCTX_PYTHON": "python3",
                                                            "WSCTX_FAULT_WORKER_SEQS": "1", "WSCTX_LOG_LEVEL": "debug"})
    assert s.snippet_count == 6


@pytest.mark.parametrize(("env", "message"), [
    ({"WSCTX_RERANK_THRESHOLD": "5"}, "environment variable WSCTX_RERANK_THRESHOLD: rerank_threshold must be between 0 and 1, not 5"),
    ({"WSCTX_RERANK_THRESHOLD": "-1"}, "rerank_threshold must be between 0 and 1, not -1"),
    ({"WSCTX_SNIPPET_COUNT": "-3"}, "environment variable WSCTX_SNIPPET_COUNT: snippet_count must be at least 1, not -3"),
    ({"WSCTX_BUDGET_CHARS": "0"}, "budget_chars must be at least 1, not 0"),
    ({"WSCTX_MALLOC_MMAP_THRESHOLD_KB": "65536"}, "malloc_mmap_threshold_kb must be between 0 and 32768, not 65536"),
    ({"WSCTX_ARROW_MEMORY_POOL": "tcmalloc"}, "environment variable WSCTX_ARROW_MEMORY_POOL: arrow_memory_pool 'tcmalloc': use system, jemalloc, mimalloc, ''"),
])
def test_out_of_range_values_are_refused_with_the_range(env: dict[str, str], message: str) -> None:
    """A threshold outside [0, 1], a snippet count or budget under 1, or an Arrow pool not named is refused, saying what is valid."""
    with pytest.raises(ValueError) as info:
        load_settings(config_file="/nonexistent.toml", env=env)
    assert message in str(info.value)


@pytest.mark.parametrize(("args", "message"), [
    (["ask", "--threshold", "5", "q"], "--threshold: rerank_threshold must be between 0 and 1, not 5"),
    (["ask", "--snippets", "0", "q"], "--snippets: snippet_count must be at least 1, not 0"),
    (["--config", "/nonexistent/wsctx.toml", "status"], "config file /nonexistent/wsctx.toml does not exist"),
    (["ask", "--set", "rrf_k=0", "q"], "--set: rrf_k must be at least 1, not 0"),
    (["ask", "--set", "rrf_k", "q"], "--set 'rrf_k': use NAME=VALUE"),
])
def test_the_command_line_refuses_bad_values_before_asking(tmp_path: Path, args: list[str], message: str) -> None:
    """wsctx refuses an out-of-range per-question value, a malformed --set or a --config file that does not exist, with one clear line and a non-zero exit."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "WSCTX_RUNTIME_DIR": str(tmp_path / "r"), "WSCTX_DATA_DIR": str(tmp_path / "d")}
    done = subprocess.run([sys.executable, "-m", "daemons.cli", *args], cwd=str(REPO), env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and message in done.stderr, done.stderr


def test_ranking_spec_gives_spec_section_2_in_one_setting(tmp_path: Path) -> None:
    """``ranking = "spec"`` sets SPEC §2's ranking (k = 60, no file or named lists, every weight 1, whole questions, probability order); an unknown ranking is refused with the choices."""
    tuned = load_settings(env={"WSCTX_CONFIG": str(tmp_path / "none.toml")})
    assert tuned.ranking == "tuned" and tuned.rrf_k == 30 and tuned.question_analysis
    cfg = tmp_path / "c.toml"
    cfg.write_text('[search]\nranking = "spec"\n')
    spec = load_settings(env={"WSCTX_CONFIG": str(cfg)})
    assert (spec.rrf_k, spec.file_keyword_pool, spec.path_mentions, spec.question_analysis) == (60, 0, False, False)
    assert (spec.test_weight, spec.doc_weight, spec.config_weight, spec.vendored_weight, spec.question_copy_weight) == (1.0,) * 5
    assert tuned.question_copy_weight < 1.0
    assert set(spec.list_weights().values()) == {1.0} and spec.rerank_fusion_weight >= 100 and spec.rerank_fusion_weight_long >= 100
    assert set(spec.list_weights(traceback=True).values()) == {1.0}
    assert tuned.list_weights(traceback=True)["file_keyword"] < tuned.list_weights()["file_keyword"]
    with pytest.raises(ValueError, match="use tuned, spec"):
        load_settings(env={"WSCTX_CONFIG": str(tmp_path / "none.toml"), "WSCTX_RANKING": "best"})


def test_a_question_overrides_only_ranking_settings_and_each_bad_one_is_named(tmp_path: Path) -> None:
    """with_overrides types command-line strings, applies a ranking preset under the other overrides, leaves the daemons' settings as they were, and refuses unknown, non-ranking, mistyped or out-of-range values by name."""
    base = load_settings(env={"WSCTX_CONFIG": str(tmp_path / "none.toml")})
    mine = with_overrides(base, {"rrf_k": "5", "path_mentions": "off", "list_weight_vector": "1.5"})
    assert (mine.rrf_k, mine.path_mentions, mine.list_weight_vector) == (5, False, 1.5)
    assert (base.rrf_k, base.path_mentions, base.list_weight_vector) == (30, True, 0.5)
    mine = with_overrides(base, {"list_weight_file_keyword_traceback": "1", "list_weight_file_bm25_traceback": "1"})
    assert mine.list_weights(traceback=True) == base.list_weights() != base.list_weights(traceback=True)
    assert with_overrides(base, {}) is base
    spec = with_overrides(base, {"ranking": "spec", "rrf_k": 10})
    assert (spec.rrf_k, spec.file_keyword_pool, spec.test_weight) == (10, 0, 1.0)
    back = with_overrides(spec, {"ranking": "tuned"})
    assert (back.rrf_k, back.file_keyword_pool, back.test_weight) == (base.rrf_k, base.file_keyword_pool, base.test_weight)
    for overrides, message in (({"rrf": 5}, "unknown setting 'rrf'; did you mean 'rrf_k'?"),
                               ({"data_dir": "/x"}, "data_dir cannot be set for one question"),
                               ({"rrf_k": "many"}, "rrf_k = 'many': expected a whole number"),
                               ({"path_mentions": "maybe"}, "path_mentions = 'maybe': expected one of"),
                               ({"doc_weight": -1}, "doc_weight must be between 0 and 1, not -1"),
                               ({"list_weight_file_bm25_traceback": -1}, "list_weight_file_bm25_traceback must be at least 0, not -1"),
                               ({"dense_query": "sum"}, "dense_query 'sum': use")):
        with pytest.raises(ValueError) as info:
            with_overrides(base, overrides, "--set")
        assert str(info.value).startswith("--set: ") and message in str(info.value), info.value


def test_a_bare_environment_finds_the_runtime_folder_a_login_shell_uses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without XDG_RUNTIME_DIR (an MCP server launched with a bare environment) the runtime folder is the user's systemd one when it exists, as a login shell's XDG_RUNTIME_DIR gives, else /tmp/wsctx-UID."""
    import os

    from daemons.lib import config

    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(config, "SYSTEMD_RUNTIME_ROOT", tmp_path)
    assert config._default_runtime_dir() == f"/tmp/wsctx-{os.getuid()}"
    (tmp_path / str(os.getuid())).mkdir()
    bare = config._default_runtime_dir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / str(os.getuid())))
    assert bare == config._default_runtime_dir() == str(tmp_path / str(os.getuid()) / "wsctx")


def test_every_setting_lives_in_exactly_one_section_and_sections_read_as_toml_tables(tmp_path: Path) -> None:
    """Settings is its sections' fields and nothing else, the index shape is one section, and a key under its section's table is read."""
    from daemons.lib.config import INDEX_SHAPING, SECTIONS, IndexShape, Settings

    homes: dict[str, str] = {}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            assert f.name not in homes, f"{f.name} is in both [{homes[f.name]}] and [{section}]"
            homes[f.name] = section
    assert list(homes) == [f.name for f in dataclasses.fields(Settings)]
    assert INDEX_SHAPING == tuple(f.name for f in dataclasses.fields(IndexShape))
    cfg = tmp_path / "config.toml"
    cfg.write_text("[search]\nrerank_top = 9\n[reranking]\nrerank_threshold = 0.2\n[index_shape]\nchunk_max_chars = 900\n")
    s = load_settings(str(cfg), env={})
    assert (s.rerank_top, s.rerank_threshold, s.chunk_max_chars) == (9, 0.2, 900)


def test_a_daemon_process_uses_the_arrow_pool_its_settings_name() -> None:
    """use_arrow_pool makes the named pool Arrow's default in a process that has pyarrow loaded, and leaves it to a process that loads it later."""
    code = (
        "import os, pyarrow as pa\n"
        "from daemons.lib import runtime\n"
        "before = pa.default_memory_pool().backend_name\n"
        "print(before, runtime.use_arrow_pool('system'), pa.default_memory_pool().backend_name, runtime.use_arrow_pool(''))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, env={**os.environ, "ARROW_DEFAULT_MEMORY_POOL": "mimalloc"})
    assert out.stdout.split() == ["mimalloc", "system", "system", "system"], out.stdout + out.stderr
    later = "from daemons.lib import runtime\nprint(repr(runtime.use_arrow_pool('jemalloc')))\nimport pyarrow as pa\nprint(pa.default_memory_pool().backend_name)\n"
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    out = subprocess.run([sys.executable, "-c", later], cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
    assert out.stdout.split() == ["''", "jemalloc"], out.stdout + out.stderr


@pytest.mark.timeout(180)
@pytest.mark.parametrize("daemon,variable,value,named", [
    ("embedder", "WSCTX_WINDOW_OVERLAP", "800", "window_overlap (800) must be less than window_chars"),
    ("reranker", "WSCTX_HEARTBEAT_S", "inf", "heartbeat_s must be a finite number"),
    ("front", "WSCTX_RERANK_THRESHOLD", "nan", "rerank_threshold must be a finite number"),
    ("front", "WSCTX_MAX_MESSAGE_BYTES", "-5", "WSCTX_MAX_MESSAGE_BYTES='-5'"),
])
def test_settings_that_would_break_a_daemon_are_refused_by_it_and_by_up(daemons, env, daemon: str, variable: str, value: str, named: str) -> None:
    """A setting that starts a daemon but breaks it makes the daemon exit at once naming it, and `wsctx up` refuses it before starting anything."""
    extra = {variable: value, **({"WSCTX_WINDOW_CHARS": "800"} if variable == "WSCTX_WINDOW_OVERLAP" else {})}
    bad = {**env, **extra}
    d = daemons([daemon])
    d.start(daemon, wait=False, **extra)
    assert d.procs[daemon].wait(60) == 2
    log = d.log(daemon)
    assert named in log and "bad settings" in log and "Traceback" not in log, log
    up = subprocess.run([sys.executable, "-m", "daemons.cli", "up", "--timeout", "20"], env=bad, cwd=str(REPO), capture_output=True,
                        text=True, timeout=120)
    assert up.returncode == 1 and named in up.stderr, up.stdout + up.stderr
    assert not (Path(env["WSCTX_RUNTIME_DIR"]) / "supervisord.pid").exists()


def test_relative_and_empty_folders_are_made_absolute_or_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative WSCTX_RUNTIME_DIR / WSCTX_DATA_DIR is taken from the current folder once, as an absolute path; an empty one is refused by name."""
    monkeypatch.chdir(tmp_path)
    s = load_settings(config_file="/nonexistent", env={"WSCTX_RUNTIME_DIR": "run", "WSCTX_DATA_DIR": "./data"})
    assert s.runtime_dir == str(tmp_path / "run") and s.data_dir == str(tmp_path / "data")
    for var in ("WSCTX_RUNTIME_DIR", "WSCTX_DATA_DIR"):
        with pytest.raises(ValueError, match=f"{var}: {var[6:].lower()} is empty"):
            load_settings(config_file="/nonexistent", env={var: ""})


def test_settings_that_cannot_work_together_are_refused_by_name() -> None:
    """Crossed chunk sizes, a bad team_workspaces entry and a tcp front without keys are refused naming the settings."""
    for overrides, message in (({"chunk_min_chars": 900, "chunk_max_chars": 800}, "chunk_min_chars (900) must be at most chunk_max_chars"),
                               ({"team_workspaces": ["alice"]}, "team_workspaces entry 'alice': write KEY=WORKSPACE"),
                               ({"front_tcp": "tcp://127.0.0.1:5999"}, "front_tcp_insecure"),
                               ({"front_tcp": "tcp://0.0.0.0:5999", "front_tcp_insecure": True}, "off loopback without CURVE keys")):
        with pytest.raises(ValueError, match=".*") as info:
            load_settings(config_file="/nonexistent", env={}, **overrides)
        assert message in str(info.value), info.value
