"""``wsctx ask`` and ``wsctx eval``: a question sent to the front, and the workspace's history asked as questions."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Sequence

from daemons.status_report import format_ask, still_indexing
from daemons.cli.common import CLIError, ipc_path, settings_of, gather_status, is_up, resolve_workspace


def question_overrides(settings, pairs: Sequence[str]) -> dict[str, str]:
    """``--set NAME=VALUE`` flags as a question's overrides, checked here so that a bad one is one
    clear line before anything is asked."""
    from daemons.lib.config import with_overrides

    out: dict[str, str] = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq or not name.strip():
            raise CLIError(f"--set {pair!r}: use NAME=VALUE (e.g. --set rrf_k=60)")
        out[name.strip()] = value.strip()
    try:
        with_overrides(settings, out, "--set")
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    return out


def build_ask_request(args: argparse.Namespace, workspace: str, overrides: dict[str, str] | None = None):
    from protocol.schema import AskRequest, AskSettings

    def absolute(p: str) -> str:
        return os.path.abspath(p)

    return AskRequest(
        question=args.question,
        workspace=workspace,
        conversation_id=args.conversation or "",
        active_file=absolute(args.file) if args.file else None,
        visible_files=[absolute(p) for p in args.visible],
        open_documents=[absolute(p) for p in args.open],
        settings=AskSettings(threshold=args.threshold, snippet_count=args.snippets, budget_chars=args.budget, rerank=not args.no_rerank,
                              deadline_ms=args.deadline, overrides=overrides or {}),
        include_team=not args.no_team,
    )


def front_endpoint(settings) -> str:
    """The running front's endpoint; CLIError when the front is not up."""
    endpoint = settings.endpoint("front")
    path = ipc_path(endpoint)
    if (path is not None and not path.exists()) or not is_up(settings, "front"):
        raise CLIError("front is not running: start it with `wsctx up`")
    return endpoint


def ask_front(client, request, timeout_s: float):
    """The front's reply body to *request*; CLIError naming a timeout or the front's error."""
    from protocol.errors import ProtocolError, Timeout

    try:
        return client.request(request, timeout_ms=int(timeout_s * 1000)).body
    except Timeout:
        raise CLIError(f"front did not answer within {timeout_s:g} s: see `wsctx status` and `wsctx logs front`") from None
    except ProtocolError as exc:
        raise CLIError(f"front: {exc.code.value}: {exc.message}") from None


def cmd_ask(args: argparse.Namespace) -> int:
    import msgspec

    from daemons.lib import runtime
    from daemons.lib.config import question_settings_problem

    settings = settings_of(args)
    name, problem = question_settings_problem(args.threshold, args.snippets, args.budget, args.deadline)
    if problem:
        flag = {"rerank_threshold": "--threshold", "snippet_count": "--snippets", "budget_chars": "--budget",
                "question_deadline_ms": "--deadline"}[name]
        raise CLIError(f"{flag}: {problem}")
    overrides = question_overrides(settings, args.set)
    if args.question == "-":  # a long issue text: an argument that size fails with "Argument list too long"
        args.question = sys.stdin.read()
    if not args.question.strip():
        raise CLIError("the question is empty")
    wid = ""
    if args.workspace:
        wid = resolve_workspace(settings, args.workspace)[0]
    else:
        try:
            wid = resolve_workspace(settings, None)[0]
        except CLIError:
            wid = ""  # let the front say which workspace it wants
    client = runtime.Client(front_endpoint(settings), sender="cli")
    try:
        body = ask_front(client, build_ask_request(args, wid, overrides), args.timeout)
    finally:
        client.close()
    data = msgspec.to_builtins(body)
    if args.json:
        print(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        print(format_ask(data))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from daemons.lib import evaluation, runtime
    from daemons.lib.history import NotAGitRepository
    from protocol.schema import AskRequest, AskSettings

    from daemons.lib.config import with_overrides

    settings = settings_of(args)
    cases = evaluation.DEFAULT_CASES if args.cases is None else args.cases
    if cases < 1:
        raise CLIError(f"--cases must be at least 1, not {cases}")
    overrides = question_overrides(settings, args.set)
    wid, root = resolve_workspace(settings, args.workspace)
    endpoint = front_endpoint(settings)
    report = gather_status(settings)["workspaces"].get(wid)
    if report is not None and (still_indexing({wid: report}) or report.get("vectors_pending")):
        raise CLIError(f"{wid} is still being indexed: wait for it with `wsctx status --wait`, then run eval")
    try:
        ev = evaluation.build(root, settings.include_globs, settings.exclude_globs, settings.max_file_bytes, cases)
    except NotAGitRepository as exc:
        raise CLIError(f"eval asks the questions of the workspace's git history: {exc}") from None
    print(evaluation.skipped_line(ev.history), file=sys.stderr)
    if not ev.history.cases:
        raise CLIError("no commit in the history makes a question (see the skipped counts above)")
    client = runtime.Client(endpoint, sender="cli-eval")

    def product(changes: dict[str, str]) -> evaluation.Ask:
        # every candidate kept and fitted (threshold 0, any size), no deadline: the product's whole order
        ask_settings = AskSettings(threshold=0.0, snippet_count=with_overrides(settings, changes).rerank_top,
                                   budget_chars=evaluation.ANY_SIZE, deadline_ms=0, overrides=changes)

        def ask(question: str) -> list[str]:
            request = AskRequest(question=question, workspace=wid, include_team=False, settings=ask_settings)
            body = ask_front(client, request, args.timeout)
            return evaluation.files_in_order(b.path for b in body.blocks if not b.team)
        return ask

    methods: list[tuple[str, evaluation.Ask]] = [("wsctx", product({}))]
    if overrides:
        methods.append(("wsctx " + " ".join(f"{k}={v}" for k, v in overrides.items()), product(overrides)))
    methods.append((evaluation.BM25, ev.floor))
    tty = sys.stderr.isatty()

    def progress(done: int, total: int) -> None:
        if tty:
            print(f"\rasked {done}/{total}", end="" if done < total else "\n", file=sys.stderr, flush=True)
        elif done % 10 == 0 or done == total:
            print(f"asked {done}/{total}", file=sys.stderr, flush=True)

    try:
        ev.run(methods, progress)
    finally:
        client.close()
    doc = ev.report(wid, {"overrides": overrides})
    print(ev.table())
    out = Path(args.out or f"wsctx-eval-{wid}.json")
    out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    png = out.with_suffix(".png")
    why = evaluation.plot(doc, png)
    print(f"wrote {out}" + (f" and {png}" if not why else f" (no plot: {why})"))
    return 0
