"""``wsctx``: start and stop the daemons, register workspaces, ask questions, inspect models.

Every command talks to the daemons over their ipc sockets under the runtime directory (the
same ``Settings`` the daemons load: defaults, the TOML file, ``WSCTX_*`` variables, then the
global ``--runtime-dir`` / ``--data-dir`` / ``--config`` options). ``up`` and ``down`` drive
supervisord with a config generated from the repository's ``supervisord.conf``.

Exit codes: 0 ok, 1 an error (one line on stderr saying what to do), 2 a usage error.
``WSCTX_DAEMONS`` (a comma list) limits ``up`` to some of the daemons (tests, debugging).
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

from daemons import DAEMONS
from daemons.cli.common import CLIError, all_status, gather_status, selected_daemons
from daemons.cli.models import cmd_keys, cmd_models
from daemons.cli.questions import build_ask_request, cmd_ask, cmd_eval, question_overrides
from daemons.cli.service import cmd_down, cmd_logs, cmd_up
from daemons.cli.workspaces import cmd_add, cmd_gc, cmd_rebuild, cmd_remove, cmd_status

#: What editors' plugins, the benches and the tests use of the command line besides ``main``.
__all__ = ["CLIError", "DAEMONS", "all_status", "build_ask_request", "build_parser", "gather_status", "main", "parse_args",
           "question_overrides", "selected_daemons"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # same as argparse's, kept for a stable exit code 2
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _ask_arguments(sp: argparse.ArgumentParser) -> None:
    """The arguments of ``wsctx ask``."""
    sp.add_argument("question", help="the question; - reads it from standard input")
    sp.add_argument("--workspace", "-w", default=None, help="id or a path inside it (default: the one containing cwd, or the only one)")
    sp.add_argument("--file", default=None, help="the active editor's file")
    sp.add_argument("--visible", nargs="+", action="extend", default=[], metavar="F", help="files in visible editors")
    sp.add_argument("--open", nargs="+", action="extend", default=[], metavar="F", help="other open documents")
    sp.add_argument("--conversation", default="", help="conversation id (follow-up questions)")
    sp.add_argument("--threshold", type=float, default=None, help="rerank threshold for this question")
    sp.add_argument("--snippets", type=int, default=None, help="snippet count for this question")
    sp.add_argument("--budget", type=int, default=None, help="character budget for this question")
    sp.add_argument("--no-rerank", action="store_true", default=False, help="skip the cross-encoder (fused order)")
    sp.add_argument("--deadline", type=int, default=None, metavar="MS",
                    help="time budget for this question in ms (0: none; default: question_deadline_ms)")
    sp.add_argument("--no-team", action="store_true", default=False, help="do not ask the team index")
    sp.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a ranking setting for this question only (rrf_k, list_weight_vector, ranking=spec, ...); repeatable")
    sp.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the answer (default 30)")
    sp.add_argument("--json", action="store_true", default=False, help="print the AskReply as JSON")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    common.add_argument("--runtime-dir", help="folder of the ipc sockets (default: settings' runtime_dir)")
    common.add_argument("--data-dir", help="folder of the indexes, registry and logs (default: settings' data_dir)")
    common.add_argument("--config", help="settings TOML file (default: $WSCTX_CONFIG or ~/.config/wsctx/config.toml)")

    p = _Parser(prog="wsctx", description="Workspace context daemons: index a code workspace, answer questions with its code.", parents=[common])
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def add(name: str, fn: Callable[[argparse.Namespace], int], help_: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_, parents=[common], argument_default=argparse.SUPPRESS)
        sp.set_defaults(func=fn)
        return sp

    sp = add("up", cmd_up, "start the daemons under supervisord and wait until they answer")
    sp.add_argument("--foreground", action="store_true", default=False, help="keep supervisord in the foreground (Ctrl-C stops everything)")
    sp.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the daemons (default 120)")

    sp = add("down", cmd_down, "stop every daemon and supervisord")
    sp.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the processes to exit (default 60)")

    sp = add("status", cmd_status, "daemons (up/down, pid, uptime, queue) and workspaces (files, rows, pending, problems)")
    sp.add_argument("--json", action="store_true", default=False, help="print JSON")
    sp.add_argument("--wait", action="store_true", default=False, help="block until no workspace has pending work")
    sp.add_argument("--timeout", type=float, default=600.0, help="seconds --wait waits (default 600)")

    sp = add("add", cmd_add, "register a workspace folder and start indexing it")
    sp.add_argument("path")
    sp.add_argument("--force", action="store_true", default=False, help="add / or your home folder all the same")

    sp = add("rebuild", cmd_rebuild, "drop a workspace's index and rebuild it with the current settings")
    sp.add_argument("workspace", nargs="?", default=None, help="id or a path inside it (default: the one containing cwd, or the only one)")

    sp = add("remove", cmd_remove, "unregister a workspace and delete its index (the folder itself is untouched)")
    sp.add_argument("workspace", help="id or a path inside it")

    sp = add("gc", cmd_gc, "delete the indexes of workspaces whose folder is gone, and of no registered workspace (asks first)")
    sp.add_argument("--yes", action="store_true", default=False, help="delete without asking")

    sp = add("logs", cmd_logs, "show the daemons' log files (JSON lines)")
    sp.add_argument("daemon", nargs="?", default=None, choices=DAEMONS)
    sp.add_argument("-f", "--follow", action="store_true", default=False)
    sp.add_argument("-n", "--lines", type=int, default=20, help="lines per file (default 20)")

    sp = add("ask", cmd_ask, "ask the front a question and print the code blocks and the context line")
    _ask_arguments(sp)

    sp = add("eval", cmd_eval, "measure retrieval on the workspace's own git history: its commits asked as questions, "
                               "the files they changed as answers, beside whole-file BM25")
    sp.add_argument("workspace", nargs="?", default=None, help="id or a path inside it (default: the one containing cwd, or the only one)")
    sp.add_argument("--cases", type=int, default=None, metavar="N", help="questions asked, newest commits first (default 50)")  # evaluation.DEFAULT_CASES
    sp.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a ranking setting to compare side by side with the current ones (rrf_k, ranking=spec, ...); repeatable")
    sp.add_argument("--out", default=None, help="the JSON report (default wsctx-eval-WORKSPACE.json; the plot goes beside it as .png)")
    sp.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for one answer (default 60)")

    sp = add("keys", cmd_keys, "make a CURVE key pair for tcp access (front_tcp, team fronts)")
    sp.add_argument("dir", help="folder to write NAME.key and NAME.key_secret into")
    sp.add_argument("--name", default="wsctx", help="file name stem (default wsctx)")

    sp = add("models", cmd_models, "show, verify or try the installed models")
    sp.add_argument("action", nargs="?", default=None, choices=["list", "verify", "score"])
    sp.add_argument("query", nargs="?", default=None)
    sp.add_argument("passage", nargs="?", default=None)
    return p


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "models":
        if args.action == "score" and (args.query is None or args.passage is None):
            parser.exit(2, "wsctx models: error: `score` needs QUERY and PASSAGE\n")
        if args.action != "score" and (args.query is not None or args.passage is not None):
            parser.exit(2, "wsctx models: error: only `score` takes QUERY and PASSAGE\n")
    if getattr(args, "lines", 0) < 0:
        parser.exit(2, "wsctx logs: error: -n must be >= 0\n")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return int(exc.code) if isinstance(exc.code, int) else 2
    try:
        return args.func(args)
    except CLIError as exc:
        print(f"wsctx: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0

