"""The ``wsctx`` command line: argument parsing, output formatting, the supervisord config, and one
real run of ``up`` / ``add`` / ``status --wait`` / ``ask`` / ``down`` under supervisord."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from daemons import cli, supervision
from daemons import status_report
from daemons.cli import models as cli_models
from tests.support import REPO, daemon_env, short_tmpdir

# --------------------------------------------------------------------------- parsing


def test_global_options_before_or_after_the_command():
    a = cli.parse_args(["--runtime-dir", "/tmp/a", "--data-dir", "/tmp/d", "status", "--json"])
    assert (a.runtime_dir, a.data_dir, a.json, a.wait) == ("/tmp/a", "/tmp/d", True, False)
    b = cli.parse_args(["status", "--runtime-dir", "/tmp/b", "--config", "/x.toml"])
    assert (b.runtime_dir, b.config) == ("/tmp/b", "/x.toml")
    assert not hasattr(b, "data_dir")  # unset globals stay unset (settings decide)


def test_ask_options():
    a = cli.parse_args(["ask", "where is retry?", "--file", "a.py", "--visible", "b.py", "c.py", "--visible", "d.py",
                        "--open", "e.py", "--threshold", "0.2", "--snippets", "3", "--budget", "5000", "--conversation", "c1"])
    assert a.question == "where is retry?"
    assert a.visible == ["b.py", "c.py", "d.py"] and a.open == ["e.py"]
    assert (a.threshold, a.snippets, a.budget, a.conversation) == (0.2, 3, 5000, "c1")
    req = cli.build_ask_request(a, "w1")
    assert req.workspace == "w1" and req.conversation_id == "c1"
    assert req.active_file == os.path.abspath("a.py")
    assert req.visible_files == [os.path.abspath(p) for p in ("b.py", "c.py", "d.py")]
    assert (req.settings.threshold, req.settings.snippet_count, req.settings.budget_chars, req.settings.rerank) == (0.2, 3, 5000, True)
    d = cli.build_ask_request(cli.parse_args(["ask", "q"]), "")
    assert d.active_file is None and d.settings.threshold is None and d.visible_files == []


@pytest.mark.parametrize(
    "argv",
    [[], ["bogus"], ["ask"], ["models", "score", "only-query"], ["models", "verify", "extra"], ["logs", "nodaemon"],
     ["logs", "-n", "-3"], ["status", "--timeout", "abc"]],
)
def test_usage_errors_exit_2(argv, capsys):
    assert cli.main(argv) == 2
    assert "error" in capsys.readouterr().err


def test_help_exits_0(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("up", "down", "status", "add", "rebuild", "logs", "ask", "keys", "models"):
        assert command in out


def test_selected_daemons():
    assert cli.selected_daemons({}) == list(cli.DAEMONS)
    assert cli.selected_daemons({"WSCTX_DAEMONS": "front, watcher"}) == ["watcher", "front"]
    with pytest.raises(cli.CLIError, match="nope"):
        cli.selected_daemons({"WSCTX_DAEMONS": "watcher,nope"})


# --------------------------------------------------------------------------- formatting


def test_durations_and_sizes():
    assert status_report.fmt_duration(None) == "-"
    assert status_report.fmt_duration(5.7) == "5s"
    assert status_report.fmt_duration(125) == "2m05s"
    assert status_report.fmt_duration(3 * 3600 + 60 * 7) == "3h07m"
    assert status_report.fmt_duration(2 * 86400 + 3600) == "2d01h"
    assert status_report.fmt_age(None) == "never"
    assert status_report.fmt_age(100.0, now=160.0) == "1m00s ago"
    assert status_report.fmt_bytes(512) == "512 B" and status_report.fmt_bytes(2048) == "2.0 KB" and status_report.fmt_bytes(3 << 20) == "3.0 MB"


def test_table_aligns_columns():
    text = status_report.table(["a", "bb"], [["xxx", 1], [None, 22]])
    lines = text.splitlines()
    assert lines[0] == "a    bb"
    assert lines[1] == "xxx  1"
    assert lines[2] == "-    22"


def test_format_daemons_shows_down_ones():
    text = status_report.format_daemons({"watcher": {"pid": 42, "uptime_s": 61, "queue_depth": 3}, "front": None})
    lines = text.splitlines()
    assert lines[0].split() == ["daemon", "state", "pid", "uptime", "queue"]
    assert lines[1].split() == ["watcher", "up", "42", "1m01s", "3"]
    assert lines[2].split() == ["front", "down", "-", "-", "-"]


SAMPLE_REPLY = {
    "status": "ok",
    "searched_query": "where is the retry logic?",
    "keyword_query": "retry logic",
    "blocks": [
        {"label": "src/net.py:10-24", "path": "src/net.py", "start_line": 10, "end_line": 24,
         "text": "def retry(call):\n    ...\n", "probability": 0.913, "retrievers": ["vector", "keyword"], "team": None, "kind": "code"},
        {"label": "team:lib/b.py:1-3", "path": "lib/b.py", "start_line": 1, "end_line": 3,
         "text": "x = 1", "probability": None, "retrievers": [], "team": "acme", "kind": "code"},
    ],
    "near_misses": [{"label": "docs/retry.md:1-9", "path": "docs/retry.md", "start_line": 1, "end_line": 9, "probability": 0.051}],
    "prompt": "...",
    "context_line": 'searched "where is the retry logic?" · reranked 12 · kept src/net.py:10-24 (0.91)',
}


def test_format_ask_blocks_near_misses_and_context_line_last():
    text = status_report.format_ask(SAMPLE_REPLY)
    lines = text.splitlines()
    assert lines[0] == "== src/net.py:10-24  p=0.91  [vector, keyword]"
    assert lines[1] == "def retry(call):"
    assert "== team:lib/b.py:1-3  (team acme)" in lines
    assert "near misses:" in lines and "  docs/retry.md:1-9  p=0.05" in lines
    assert lines[-1] == SAMPLE_REPLY["context_line"]
    empty = status_report.format_ask({"blocks": [], "context_line": "searched x · reranked 0"})
    assert "no code above the threshold" in empty and empty.splitlines()[-1] == "searched x · reranked 0"


def test_workspace_report_combines_watcher_and_embedder(tmp_path):
    from daemons.lib.workspaces import Registry

    ws = tmp_path / "w"
    ws.mkdir()
    from daemons.lib.config import load_settings

    settings = load_settings(config_file="/nonexistent", env={}, runtime_dir=str(tmp_path / "r"), data_dir=str(tmp_path / "d"))
    wid, root = Registry(settings.data_dir).add(ws)
    statuses = {
        "watcher": {"details": {"workspaces": {wid: {"root": root, "files": 5, "indexed_files": 3, "pending": 2, "skipped": 1, "last_reconcile": 1.0}}}},
        "embedder": {"details": {"model_error": "", "workspaces": {wid: {"root": root, "problem": "rebuild needed: window_chars is 500 in the index but 600 now", "files": 3, "chunks": 9, "rows": 11, "last_update": 2.0}}}},
    }
    rep = status_report.workspace_report(settings, statuses)[wid]
    assert (rep["files"], rep["indexed_files"], rep["chunks"], rep["rows"], rep["pending"]) == (5, 3, 9, 11, 2)
    assert any(p.startswith("rebuild needed") and f"wsctx rebuild {wid}" in p for p in rep["problems"])
    assert not status_report.indexing_done({wid: rep})
    text = status_report.format_workspaces({wid: rep}, now=12.0)
    assert wid in text and "10s ago" in text and "! rebuild needed" in text

    down = status_report.workspace_report(settings, {"watcher": None, "embedder": None, "front": {"details": {}}})[wid]
    assert down["files"] is None and down["pending"] is None
    assert (down["chunks"], down["rows"], down["indexed_files"]) == (0, 0, 0)  # no table yet
    assert any("watcher is down" in p for p in down["problems"])
    assert any("embedder is down" in p for p in down["problems"])
    # everything down: one plain problem, not what each missing daemon would degrade
    all_down = status_report.workspace_report(settings, {"watcher": None, "embedder": None, "front": None})[wid]
    assert all_down["problems"] == ["wsctx is not running: start it with `wsctx up`"]
    assert status_report.indexing_done({wid: dict(rep, pending=0)})


# --------------------------------------------------------------------------- supervisord config


def test_template_has_every_daemon_with_the_required_settings():
    import configparser

    cp = configparser.RawConfigParser()
    cp.read(REPO / "supervisord.conf")
    assert cp.get("unix_http_server", "chmod") == "0700"
    assert cp.get("supervisord", "nodaemon") == "false"
    assert "supervisorctl" in cp and "rpcinterface:supervisor" in cp
    for d in cli.DAEMONS:
        sec = f"program:{d}"
        assert cp.get(sec, "command") == f"%(ENV_WSCTX_PYTHON)s -m daemons.{d}"
        for key, value in [("autorestart", "true"), ("startsecs", "1"), ("stopsignal", "TERM"), ("stopwaitsecs", "10"),
                           ("stopasgroup", "true"), ("killasgroup", "true"), ("redirect_stderr", "true"),
                           ("stdout_logfile_maxbytes", "10MB"), ("stdout_logfile_backups", "3")]:
            assert cp.get(sec, key) == value, (sec, key)
        env = cp.get(sec, "environment")
        for var in ("WSCTX_RUNTIME_DIR", "WSCTX_DATA_DIR", "WSCTX_CONFIG", "PYTHONUNBUFFERED"):
            assert var in env


def test_rendered_config_is_valid_for_supervisord(tmp_path):
    from supervisor.options import ServerOptions

    run, data = tmp_path / "r%x", tmp_path / "d"
    run.mkdir()
    (data / "logs").mkdir(parents=True)
    values = {"WSCTX_PYTHON": "/venv/bin/python", "WSCTX_RUNTIME_DIR": str(run), "WSCTX_DATA_DIR": str(data), "WSCTX_CONFIG": "/nonexistent"}
    text = supervision.render_supervisor_conf((REPO / "supervisord.conf").read_text(), values, ["watcher", "front"], "/repo")
    assert "%(ENV_" not in text and "[program:chunker]" not in text
    conf = tmp_path / "s.conf"
    conf.write_text(text)
    opts = ServerOptions()
    opts.configfile = str(conf)
    opts.process_config(do_usage=False)
    procs = {p.name: p for g in opts.process_group_configs for p in g.process_configs}
    assert set(procs) == {"watcher", "front"}
    front = procs["front"]
    assert front.command == "/venv/bin/python -m daemons.front"
    assert front.directory == "/repo"
    assert front.stdout_logfile == str(data / "logs" / "front.log")
    assert front.environment["WSCTX_RUNTIME_DIR"] == str(run)  # the "%" survived supervisord's expansion
    assert front.stopasgroup and front.killasgroup and front.redirect_stderr
    assert opts.pidfile == str(run / "supervisord.pid")


def test_template_is_usable_directly_with_env_vars(tmp_path, monkeypatch):
    from supervisor.options import ServerOptions

    (tmp_path / "r").mkdir()
    (tmp_path / "d" / "logs").mkdir(parents=True)
    monkeypatch.setenv("WSCTX_PYTHON", sys.executable)
    monkeypatch.setenv("WSCTX_RUNTIME_DIR", str(tmp_path / "r"))
    monkeypatch.setenv("WSCTX_DATA_DIR", str(tmp_path / "d"))
    monkeypatch.setenv("WSCTX_CONFIG", "/nonexistent")
    opts = ServerOptions()
    opts.configfile = str(REPO / "supervisord.conf")
    opts.process_config(do_usage=False)
    procs = {p.name: p for g in opts.process_group_configs for p in g.process_configs}
    assert set(procs) == set(cli.DAEMONS)
    assert procs["watcher"].directory == str(REPO)


# --------------------------------------------------------------------------- commands without daemons


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    base = short_tmpdir("wc")
    for key in [k for k in os.environ if k.startswith("WSCTX_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("WSCTX_CONFIG", "/nonexistent")
    yield ["--runtime-dir", str(base / "r"), "--data-dir", str(base / "d")], base
    shutil.rmtree(base, ignore_errors=True)


def test_status_with_nothing_running(dirs, capsys):
    flags, base = dirs
    assert cli.main(flags + ["status", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {d: v["state"] for d, v in data["daemons"].items()} == {d: "down" for d in cli.DAEMONS}
    assert data["workspaces"] == {} and data["supervisord"] is None
    assert cli.main(flags + ["status"]) == 0
    assert "no workspaces registered" in capsys.readouterr().out


def test_add_without_watcher_registers(dirs, capsys):
    flags, base = dirs
    ws = base / "ws"
    ws.mkdir()
    assert cli.main(flags + ["add", str(ws)]) == 0
    out = capsys.readouterr()
    from daemons.lib.workspaces import workspace_id

    assert out.out.strip() == workspace_id(ws)
    assert "watcher is not running" in out.err
    assert cli.main(flags + ["add", str(base / "missing")]) == 1
    assert "does not exist" in capsys.readouterr().err
    (base / "file.txt").write_text("x")
    assert cli.main(flags + ["add", str(base / "file.txt")]) == 1
    assert "is not a directory" in capsys.readouterr().err


def test_add_refuses_an_empty_path_the_whole_filesystem_home_and_proc(dirs, capsys, monkeypatch):
    """`wsctx add ""`, `/`, `~` and `/proc` are refused with one line naming why (/ and ~ pass with --force); nothing is registered."""
    from daemons.lib.workspaces import Registry

    flags, base = dirs
    home = base / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for path, why in (("", "an empty path"), ("/", "/ is the whole file system"), (str(home), "is your home folder"),
                      ("/proc", "pseudo-filesystem"), ("/proc/self", "pseudo-filesystem")):
        assert cli.main(flags + ["add", path]) == 1, path
        err = capsys.readouterr().err
        assert why in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert Registry(base / "d").load() == {}
    assert cli.main(flags + ["add", "--force", str(home)]) == 0
    assert list(Registry(base / "d").load().values()) == [str(home.resolve())]
    capsys.readouterr()
    assert cli.main(flags + ["add", "--force", "/proc"]) == 1  # never a pseudo-filesystem


def test_add_of_a_non_utf8_name_or_onto_a_full_disk_says_one_line(dirs, capsys):
    """A folder whose name is not UTF-8, and a registry that cannot be written, give one line naming the cause, no traceback."""
    import os as _os

    flags, base = dirs
    odd = _os.fsdecode(str(base).encode() + b"/caf\xe9")
    _os.mkdir(odd)
    assert cli.main(flags + ["add", odd]) == 1
    err = capsys.readouterr().err
    assert "not a valid UTF-8 name" in err and "Traceback" not in err
    # a registry file that cannot be written (a folder in its place: as with a full disk, the
    # write fails with an OSError, which even root gets)
    (base / "d" / "workspaces.json").mkdir(parents=True)
    ws = base / "ws"
    ws.mkdir()
    rc = cli.main(flags + ["add", str(ws)])
    err = capsys.readouterr().err
    assert rc == 1 and "cannot register" in err and "Traceback" not in err, err


def test_errors_when_daemons_are_down(dirs, capsys):
    flags, base = dirs
    assert cli.main(flags + ["ask", "where is the retry logic?"]) == 1
    assert capsys.readouterr().err.strip() == "wsctx: error: front is not running: start it with `wsctx up`"
    assert cli.main(flags + ["rebuild"]) == 1
    assert "no workspace is registered" in capsys.readouterr().err
    (base / "ws").mkdir()
    cli.main(flags + ["add", str(base / "ws")])
    capsys.readouterr()
    assert cli.main(flags + ["rebuild"]) == 1
    assert "embedder is not running" in capsys.readouterr().err
    assert cli.main(flags + ["down"]) == 0
    assert "not running" in capsys.readouterr().out
    assert cli.main(flags + ["logs"]) == 1


def test_status_wait_gives_up_when_the_pipeline_is_down(dirs, capsys):
    flags, base = dirs
    (base / "ws").mkdir()
    cli.main(flags + ["add", str(base / "ws")])
    capsys.readouterr()
    started = time.monotonic()
    assert cli.main(flags + ["status", "--wait", "--timeout", "60"]) == 1
    assert time.monotonic() - started < 30
    assert "watcher is not running" in capsys.readouterr().err


def test_logs_tail(dirs, capsys):
    flags, base = dirs
    logs = base / "d" / "logs"
    logs.mkdir(parents=True)
    (logs / "watcher.log").write_text("".join(f'{{"n": {i}}}\n' for i in range(100)))
    (logs / "front.log").write_text('{"f": 1}\n')
    assert cli.main(flags + ["logs", "watcher", "-n", "2"]) == 0
    assert capsys.readouterr().out.splitlines() == ['{"n": 98}', '{"n": 99}']
    assert cli.main(flags + ["logs", "-n", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == ['watcher   {"n": 99}', 'front     {"f": 1}']


def test_models_list_and_verify(capsys, tmp_path, monkeypatch):
    assert cli.main(["models"]) == 0
    out = capsys.readouterr().out
    assert "minilm-l6-v2" in out and "dim 384" in out and "model.int8.onnx" in out
    assert cli.main(["models", "verify"]) == 0
    assert "minilm-l6-v2: ok" in capsys.readouterr().out
    # a corrupted copy fails with the file named
    bad = tmp_path / "artifacts" / "broken"
    bad.mkdir(parents=True)
    (bad / "model.onnx").write_bytes(b"x")
    (bad / "tok.json").write_text("{}")
    from models.manifest import write_manifest

    write_manifest(bad, {"name": "broken", "model_file": "model.onnx", "tokenizer": "tok.json", "dim": 1, "max_tokens": 8})
    (bad / "model.onnx").write_bytes(b"y")
    monkeypatch.setattr(cli_models, "ARTIFACTS", tmp_path / "artifacts")
    assert cli.main(["models", "verify"]) == 1
    captured = capsys.readouterr()
    assert "broken: FAILED" in captured.out and "model.onnx: corrupt (sha256" in captured.out
    assert "failed verification" in captured.err


def test_keys_makes_a_curve_pair(tmp_path, capsys):
    import zmq.auth

    assert cli.main(["keys", str(tmp_path / "k"), "--name", "front"]) == 0
    public, secret = zmq.auth.load_certificate(str(tmp_path / "k" / "front.key_secret"))
    assert public and secret
    assert (tmp_path / "k" / "front.key_secret").stat().st_mode & 0o077 == 0
    assert cli.main(["keys", str(tmp_path / "k"), "--name", "front"]) == 1
    assert "already exists" in capsys.readouterr().err


# --------------------------------------------------------------------------- the real thing


def _wsctx(env: dict[str, str], *args: str, timeout: float = 200, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "daemons.cli", *args], env=env, cwd=str(REPO), capture_output=True, text=True,
                          timeout=timeout, input=stdin)


@pytest.mark.timeout(240)
def test_up_add_status_ask_down():
    base = short_tmpdir("wc")
    env = daemon_env(base)
    if os.environ.get("WSCTX_DAEMONS"):  # a subset while some daemon is being worked on
        env["WSCTX_DAEMONS"] = os.environ["WSCTX_DAEMONS"]
    daemons = cli.selected_daemons(env)
    run_dir = env["WSCTX_RUNTIME_DIR"]
    ws = base / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "net.py").write_text(
        "import time\n\n\ndef retry(call, attempts=3):\n    \"\"\"Call again with exponential backoff when it fails.\"\"\"\n"
        "    for i in range(attempts):\n        try:\n            return call()\n        except OSError:\n"
        "            time.sleep(2 ** i)\n    raise RuntimeError('gave up')\n"
    )
    (ws / "README.md").write_text("# Tiny\n\nA tiny workspace for the command line test, with a retry helper.\n")
    try:
        up = _wsctx(env, "up", "--timeout", "150")
        assert up.returncode == 0, up.stdout + up.stderr
        for d in daemons:
            assert any(line.split()[:2] == [d, "up"] for line in up.stdout.splitlines()), up.stdout
        again = _wsctx(env, "up")
        assert again.returncode == 0 and "already up" in again.stdout

        added = _wsctx(env, "add", str(ws))
        assert added.returncode == 0, added.stderr
        wid = added.stdout.strip()

        if "watcher" in daemons and "embedder" in daemons and "chunker" in daemons:
            st = _wsctx(env, "status", "--wait", "--timeout", "90", "--json")
            assert st.returncode == 0, st.stdout + st.stderr
            data = json.loads(st.stdout)
            w = data["workspaces"][wid]
            assert (w["files"], w["indexed_files"], w["pending"]) == (2, 2, 0), w
            assert w["chunks"] >= 2 and w["rows"] >= w["chunks"] and w["problems"] == []
            assert all(data["daemons"][d]["state"] == "up" for d in daemons)
            # the data folder (registry, indexes, logs) is owner-only, every file and folder in it
            data_dir = Path(env["WSCTX_DATA_DIR"])
            loose = [str(p) for p in [data_dir, *data_dir.rglob("*")] if not p.is_symlink() and p.stat().st_mode & 0o077]
            assert loose == [], loose[:10]

        if "front" in daemons:
            ask = _wsctx(env, "ask", "where is the retry logic?", "--json", "--timeout", "60")
            assert ask.returncode == 0, ask.stdout + ask.stderr
            reply = json.loads(ask.stdout)
            assert reply["context_line"]
            if "searcher" in daemons:
                assert any(b["path"] == "src/net.py" for b in reply["blocks"] + reply.get("near_misses", [])), reply
            # a question too long for an argument comes on standard input
            long_question = "where is the retry logic?\n" + "the request is retried after a timeout, " * 1500
            piped = _wsctx(env, "ask", "-", "--json", "--timeout", "60", stdin=long_question)
            assert piped.returncode == 0, piped.stdout + piped.stderr
            assert json.loads(piped.stdout)["searched_query"] == long_question.strip()

        if "watcher" in daemons and "embedder" in daemons:
            # remove: unregistered, the index folder deleted by the embedder, nothing indexed after
            index = Path(env["WSCTX_DATA_DIR"]) / "indexes" / wid
            assert index.is_dir()
            searcher = json.loads(_wsctx(env, "status", "--json").stdout)["daemons"].get("searcher", {}).get("details", {})
            if "searcher" in daemons and "front" in daemons:
                assert wid in searcher["open_tables"] and searcher["lance_cache"]["bytes"] > 0, searcher
                assert searcher["arrow"]["pool"] == "system", searcher  # glibc's malloc, not mimalloc's kept pages
            removed = _wsctx(env, "remove", wid)
            assert removed.returncode == 0, removed.stdout + removed.stderr
            assert f"removed {wid}" in removed.stdout and "MB freed" in removed.stdout
            assert not index.exists()
            (ws / "src" / "later.py").write_text("def later():\n    return 'written after the workspace was removed'\n")
            time.sleep(2)  # several debounce periods: an event for it would have been sent by now
            st = json.loads(_wsctx(env, "status", "--json").stdout)
            assert wid not in st["workspaces"] and not index.exists()
            if "searcher" in daemons:  # the removed workspace's table is closed, holding no memory
                assert wid not in st["daemons"]["searcher"]["details"]["open_tables"], st["daemons"]["searcher"]
            gone = _wsctx(env, "remove", wid)
            assert gone.returncode != 0 and "no workspace is registered" in gone.stdout + gone.stderr

        logs = _wsctx(env, "logs", daemons[0], "-n", "3")
        assert logs.returncode == 0 and logs.stdout.strip(), logs.stderr
        assert all(json.loads(line) for line in logs.stdout.splitlines())
        # a log follower in another terminal has the runtime dir in its environment, but is no daemon
        follower = subprocess.Popen([sys.executable, "-m", "daemons.cli", "logs", "-f"], env=env, cwd=str(REPO),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finally:
        down = _wsctx(env, "down", "--timeout", "60")
        sockets_left = sorted(p.name for p in Path(run_dir).glob("*.sock"))
        status_down = _wsctx(env, "status").stdout
        follower_survived = follower.poll() is None if "follower" in locals() else None
        if "follower" in locals():
            follower.kill()
            follower.wait()
        left = supervision.processes_for(run_dir)
        shutil.rmtree(base, ignore_errors=True)
    assert down.returncode == 0, down.stdout + down.stderr
    assert follower_survived, "wsctx down ended a process that is not one of its daemons"
    assert sockets_left == [], sockets_left
    assert "wsctx is not running: start it with `wsctx up`" in status_down and "keywords-only" not in status_down
    assert "wsctx is down" in down.stdout
    assert left == [], f"processes left running: {left}"


def test_an_ask_outside_every_workspace_lists_the_registered_ones(tmp_path):
    """With several workspaces registered, a question from outside all of them lists them and says to pass --workspace."""
    from daemons.lib.workspaces import Registry
    from protocol.errors import UnknownWorkspace

    reg = Registry(tmp_path / "d")
    with pytest.raises(UnknownWorkspace, match=r"no workspace is registered \(run `wsctx add PATH`\)"):
        reg.resolve("")
    for name in ("alpha", "beta"):
        (tmp_path / name).mkdir()
        reg.add(tmp_path / name)
    for ref in ("", str(tmp_path / "elsewhere")):
        with pytest.raises(UnknownWorkspace) as info:
            reg.resolve(ref)
        message = info.value.message
        assert str(tmp_path / "alpha") in message and str(tmp_path / "beta") in message and "--workspace" in message
        assert "wsctx add" not in message or ref  # nothing to add when the question just did not name one


@pytest.mark.timeout(120)
def test_gc_lists_then_deletes_indexes_of_gone_folders_and_of_no_workspace():
    """`wsctx gc` lists the indexes of workspaces whose folder is gone and of no registered workspace, deletes nothing without --yes, and with it deletes just those; status shows each index's size."""
    from daemons.lib.workspaces import Registry, index_dir, workspace_id

    base = short_tmpdir("wg")
    try:
        env = daemon_env(base)
        data = Path(env["WSCTX_DATA_DIR"])
        live, dead = base / "live", base / "dead"
        live.mkdir()
        dead.mkdir()
        reg = Registry(data)
        live_id, _ = reg.add(live)
        dead_id, _ = reg.add(dead)
        orphan_id = workspace_id(base / "never-registered")
        for wid in (live_id, dead_id, orphan_id):
            index_dir(data, wid).mkdir(parents=True)
            (index_dir(data, wid) / "blob").write_bytes(b"x" * 300_000)
        dead.rmdir()

        status = _wsctx(env, "status")
        assert "0.3 MB" in status.stdout and f"wsctx remove {dead_id}" in status.stdout, status.stdout
        asked = _wsctx(env, "gc")
        assert asked.returncode == 1 and "nothing deleted" in asked.stdout
        assert dead_id in asked.stdout and orphan_id in asked.stdout and live_id not in asked.stdout
        assert index_dir(data, dead_id).is_dir() and index_dir(data, orphan_id).is_dir()

        done = _wsctx(env, "gc", "--yes")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "deleted 2 indexes, 0.6 MB freed" in done.stdout
        assert not index_dir(data, dead_id).exists() and not index_dir(data, orphan_id).exists()
        assert index_dir(data, live_id).is_dir() and set(reg.load()) == {live_id}
        assert "nothing to collect" in _wsctx(env, "gc").stdout
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_status_wait_progress_line_counts_files_rows_rate_and_time_left():
    """The progress line sums the workspaces still indexing: files done of all with the share, rows, the rate since waiting began and the time left."""
    def entry(files, done, pending, rows, reconciled=1.0):
        return {"files": files, "indexed_files": done, "pending": pending, "rows": rows, "last_reconcile": reconciled}

    report = {"a": entry(1500, 800, 700, 31020), "b": entry(10, 10, 0, 99), "c": entry(None, None, None, None, None)}
    line = status_report.progress_line(report, first_indexed=500, elapsed_s=30.0)
    assert line == "indexing: 800 of 1,500 files (53%), 31,020 rows, 10.0 files/s, about 70 s left"
    slow = status_report.progress_line({"a": entry(1500, 800, 700, 31020)}, first_indexed=790, elapsed_s=60.0)
    assert slow.endswith("0.2 files/s, about 70 min 00 s left")
    assert status_report.progress_line({"a": entry(20, 5, 15, 40)}, first_indexed=5, elapsed_s=2.0) == "indexing: 5 of 20 files (25%), 40 rows, 15 pending"


@pytest.mark.timeout(180)
def test_down_never_stops_another_instance_named_by_a_stale_pid_file():
    """A stale supervisord.pid in X's runtime dir naming Y's supervisord: `wsctx down` for X leaves every process of Y running."""
    from daemons.supervision import processes_for

    base_x, base_y = short_tmpdir("wx"), short_tmpdir("wy")
    env_x, env_y = daemon_env(base_x), daemon_env(base_y)
    env_x["WSCTX_DAEMONS"] = env_y["WSCTX_DAEMONS"] = "chunker"
    try:
        up = _wsctx(env_y, "up", "--timeout", "120")
        assert up.returncode == 0, up.stdout + up.stderr
        y_pid = int((Path(env_y["WSCTX_RUNTIME_DIR"]) / "supervisord.pid").read_text())
        y_procs = processes_for(env_y["WSCTX_RUNTIME_DIR"])
        assert y_pid in y_procs and len(y_procs) >= 2
        run_x = Path(env_x["WSCTX_RUNTIME_DIR"])
        run_x.mkdir(parents=True, mode=0o700)
        (run_x / "supervisord.pid").write_text(f"{y_pid}\n")
        down = _wsctx(env_x, "down", "--timeout", "20")
        assert down.returncode == 0, down.stdout + down.stderr
        assert "not running" in down.stdout
        assert all(supervision._alive(p) for p in y_procs), "wsctx down for X stopped Y's processes"
    finally:
        _wsctx(env_y, "down", "--timeout", "60")
        shutil.rmtree(base_x, ignore_errors=True)
        shutil.rmtree(base_y, ignore_errors=True)


@pytest.mark.timeout(180)
def test_a_busy_embedder_is_reported_slow_not_down(daemons, env, workspace):
    """An embedder whose process is alive but does not answer (stopped with SIGSTOP) is "slow" in status and never aborts `status --wait` as not running; once its process is gone it is "down"."""
    import signal as _signal

    from tests.support import register, wait_until

    (workspace / "a.py").write_text("def alpha():\n    return 1\n")
    register(env["WSCTX_DATA_DIR"], workspace)
    d = daemons(["watcher", "chunker", "embedder"])
    d.start()
    pid = d.pid("embedder")
    os.kill(pid, _signal.SIGSTOP)
    try:
        (workspace / "b.py").write_text("def beta():\n    return 2\n")  # work it cannot finish while stopped
        status = _wsctx(env, "status", "--json", timeout=60)
        data = json.loads(status.stdout)
        assert data["daemons"]["embedder"] == {"state": "slow", "pid": pid}, data["daemons"]["embedder"]
        assert "slow" in _wsctx(env, "status", timeout=60).stdout
        waited = _wsctx(env, "status", "--wait", "--timeout", "14", timeout=90)
        assert waited.returncode == 1
        assert "not running" not in waited.stderr and "indexing not done after 14 s" in waited.stderr, waited.stderr
    finally:
        os.kill(pid, _signal.SIGCONT)
    d.kill("embedder")
    wait_until(lambda: json.loads(_wsctx(env, "status", "--json", timeout=60).stdout)["daemons"]["embedder"]["state"] == "down", 30)
