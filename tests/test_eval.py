"""`wsctx eval`: a workspace's own commits asked as questions, by the rules of the eval's commit cases, through the real daemons, beside whole-file BM25."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from daemons import cli
from daemons import status_report
from daemons.lib import evaluation
from daemons.lib.history import NotAGitRepository, commit_cases
from tests.support import REPO, Daemons, daemon_env, register, short_tmpdir, table_mismatches, wait_until

GIT_ENV = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "GIT_COMMITTER_NAME": "Dev", "GIT_COMMITTER_EMAIL": "dev@example.org"}


class History:
    """A git work tree the test writes commit by commit."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.git("init", "-q", "-b", "main")

    def git(self, *args: str) -> str:
        env = {**os.environ, **GIT_ENV}
        return subprocess.run(["git", "-C", str(self.root), *args], check=True, capture_output=True, text=True, env=env).stdout

    def commit(self, message: str, files: dict[str, str | None], author: str = "Dev <dev@example.org>") -> str:
        """Write (text) or delete (None) each file, then commit them all with ``message``."""
        for rel, text in files.items():
            path = self.root / rel
            if text is None:
                self.git("rm", "-q", rel)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            self.git("add", rel)
        self.git("commit", "-q", "--author", author, "-m", message)
        return self.git("rev-parse", "HEAD").strip()


def rules_history(root: Path) -> tuple[History, dict[str, str]]:
    """One commit for each rule of the eval's commit cases; the shas of those that become questions."""
    h = History(root)
    asked = {}
    asked["config"] = h.commit("Add a parser for the settings file syntax", {"pkg/config.py": "def parse(text):\n    return dict(l.split('=') for l in text.splitlines())\n"})
    h.commit("Bump requests from 2.0 to 2.1 in the requirements", {"pkg/deps.py": "REQUESTS = '2.1'\n"}, author="dependabot[bot] <bot@example.org>")
    h.commit("Fix it", {"pkg/config.py": "def parse(text):\n    return {}\n"})
    h.commit("Reformat the whole code base with black", {"pkg/deps.py": "REQUESTS = \"2.1\"\n"})
    h.commit("Add tests for the settings file parser", {"tests/test_config.py": "def test_parse():\n    pass\n"})
    h.commit("Add six small helper modules to the package", {f"pkg/h{i}.py": f"X{i} = {i}\n" for i in range(6)})
    h.commit("Add a module for the legacy wire protocol", {"pkg/legacy.py": "def decode(b):\n    return b\n"})
    h.commit("Drop the legacy wire protocol module entirely", {"pkg/legacy.py": None})
    asked["retry"] = h.commit(
        "Retry failed requests with exponential backoff (#123)\n\nEach attempt waits twice as long as the last.\n\nSigned-off-by: Dev <dev@example.org>",
        {"pkg/retry.py": "def backoff(attempt):\n    return 2 ** attempt\n", "tests/test_retry.py": "def test_backoff():\n    pass\n"})
    h.commit("Put the token store in a package of its own", {"pkg/tokens.py": "TOKENS = {}\n"})
    h.git("mv", "pkg/tokens.py", "pkg/auth_tokens.py")
    asked["tokens"] = h.commit("Move the token store next to the authentication code", {"pkg/auth_tokens.py": "TOKENS = {}\n\n\ndef forget(user):\n    TOKENS.pop(user, None)\n"})
    return h, asked


def present(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and ".git" not in p.parts}


def test_commit_cases_follow_the_eval_rules(tmp_path: Path) -> None:
    """Commits by bots, with short subjects, sweeps, no source, too many files or files since gone are counted by rule; the rest are cleaned questions, newest first, with their non-test source files (renames by their new name) as gold."""
    h, asked = rules_history(tmp_path / "w")
    got = commit_cases(h.root, present(h.root), limit=10)
    assert [(c.commit, c.gold) for c in got.cases] == [
        (asked["tokens"], ["pkg/auth_tokens.py"]), (asked["retry"], ["pkg/retry.py"]), (asked["config"], ["pkg/config.py"])]
    assert got.cases[1].question == "Retry failed requests with exponential backoff\n\nEach attempt waits twice as long as the last."
    # "Put the token store ..." and the legacy module's two commits: their files are gone or were deleted
    assert dict(got.skipped) == {"bot": 1, "short_subject": 1, "sweep": 1, "no_source": 2, "too_many_files": 1, "gone": 2}
    assert got.commits_read == 11
    newest = commit_cases(h.root, present(h.root), limit=1)
    assert [c.commit for c in newest.cases] == [asked["tokens"]] and newest.commits_read == 1
    with pytest.raises(NotAGitRepository, match="no git history"):
        commit_cases(tmp_path, set(), limit=5)


def test_the_floor_ranks_whole_source_files_and_the_report_holds_every_case(tmp_path: Path) -> None:
    """The BM25 floor ranks source files only (no tests), and a run's report has each method's means, medians and every case with its question."""
    h, asked = rules_history(tmp_path / "w")
    ev = evaluation.build(h.root, [], [], 1_000_000, limit=10)
    assert ev.floor("how long does the backoff wait after an attempt?")[0] == "pkg/retry.py"
    assert not any(p.startswith("tests/") for p in ev.bm25.paths)
    ev.run([("first file", lambda q: ["pkg/retry.py"]), (evaluation.BM25, ev.floor)])
    doc = ev.report("w1", {})
    assert doc["cases"] == 3 and doc["skipped"]["gone"] == 2
    first = doc["summary"]["first file"]
    assert first["recall@1"] == pytest.approx(100 / 3, abs=0.1) and first["mrr"] == pytest.approx(100 / 3, abs=0.1)
    assert [r["question"].split("\n")[0] for r in doc["results"][evaluation.BM25]][1] == "Retry failed requests with exponential backoff"
    assert ev.table().splitlines()[0].split()[:5] == ["method", "recall@1", "recall@5", "recall@10", "mrr"]


FILES = {
    "shop/cart.py": "class Cart:\n    \"\"\"A shopping cart: items with quantities.\"\"\"\n\n    def __init__(self):\n        self.items = {}\n\n    def add_item(self, sku, quantity=1):\n        self.items[sku] = self.items.get(sku, 0) + quantity\n\n    def remove_item(self, sku):\n        self.items.pop(sku, None)\n",
    "shop/pricing.py": "VAT_RATE = 0.2\n\n\ndef price_with_vat(net):\n    \"\"\"The gross price: net plus value added tax.\"\"\"\n    return round(net * (1 + VAT_RATE), 2)\n\n\ndef discount(price, percent):\n    return price * (100 - percent) / 100\n",
    "shop/inventory.py": "def stock_level(warehouse, sku):\n    \"\"\"Units of a SKU on the warehouse shelves.\"\"\"\n    return warehouse.get(sku, 0)\n\n\ndef reserve_stock(warehouse, sku, units):\n    if warehouse.get(sku, 0) < units:\n        raise ValueError('not enough stock')\n    warehouse[sku] -= units\n",
    "shop/emails.py": "def order_confirmation(order_id, address):\n    \"\"\"The e-mail sent when an order is placed.\"\"\"\n    return f'To: {address}\\nSubject: order {order_id} confirmed'\n",
    "shop/shipping.py": "RATES = {'standard': 4.5, 'express': 12.0}\n\n\ndef shipping_cost(method, weight_kg):\n    \"\"\"Parcel postage by method and weight.\"\"\"\n    return RATES[method] + 0.8 * weight_kg\n",
    "shop/payments.py": "def charge_card(card_number, amount):\n    \"\"\"Charge a credit card through the payment gateway.\"\"\"\n    if not card_number.isdigit():\n        raise ValueError('bad card number')\n    return {'charged': amount}\n",
}


@pytest.mark.timeout(300)
def test_eval_asks_the_history_through_the_daemons_beside_bm25() -> None:
    """`wsctx eval --set` asks each commit through the running daemons with and without the change, prints both beside whole-file BM25, and writes the JSON report and its plot."""
    base = short_tmpdir("ev")
    try:
        h = History(base / "w")
        messages = {
            "shop/cart.py": "Let shoppers remove an item from the cart again",
            "shop/pricing.py": "Add value added tax to the gross price of a product",
            "shop/inventory.py": "Refuse to reserve more stock than the warehouse holds",
            "shop/emails.py": "Send an order confirmation e-mail when an order is placed",
            "shop/shipping.py": "Charge express parcels more postage than standard ones",
            "shop/payments.py": "Reject credit card numbers that are not digits before charging",
        }
        for rel, message in messages.items():
            h.commit(message, {rel: FILES[rel]})
        env = daemon_env(base)
        d = Daemons(("watcher", "chunker", "embedder", "searcher", "reranker", "front"), env, base)
        register(d.data_dir, h.root)
        try:
            d.start(timeout=90)
            wait_until(lambda: not table_mismatches(d.data_dir, h.root), 120, message=d.log_tail)
            # as `wsctx status --wait` does: reconciled, nothing pending, every vector built
            wait_until(lambda: not status_report.still_indexing(cli.gather_status(d.settings)["workspaces"]), 60, message=d.log_tail)
            out = base / "report.json"
            done = subprocess.run([sys.executable, "-m", "daemons.cli", "eval", str(h.root), "--set", "ranking=spec", "--out", str(out)],
                                  cwd=str(REPO), env=env, capture_output=True, text=True, timeout=240)
            assert done.returncode == 0, done.stderr + d.log_tail()
        finally:
            d.stop_all()
        assert "6 commits read, 6 asked" in done.stderr
        rows = [line.split()[0:2] for line in done.stdout.splitlines()[1:4]]
        assert [r[0] for r in rows] == ["wsctx", "wsctx", "bm25"] and "ranking=spec" in done.stdout
        doc = json.loads(out.read_text())
        assert doc["cases"] == 6 and set(doc["results"]) == {"wsctx", "wsctx ranking=spec", evaluation.BM25}
        for rows in doc["results"].values():
            assert sorted(r["gold"][0] for r in rows) == sorted(messages)
        # six distinct topics in six files: the product finds each commit's file near the top
        assert doc["summary"]["wsctx"]["recall@5"] >= 80, doc["summary"]
        assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_eval_help_names_the_default_number_of_cases() -> None:
    """The command line's help states the default number of questions that evaluation.py defines."""
    from daemons.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["eval"]
    cases = next(a for a in sub._actions if a.dest == "cases")
    assert f"(default {evaluation.DEFAULT_CASES})" in cases.help
