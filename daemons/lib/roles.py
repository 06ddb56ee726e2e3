"""What a file is for (source, test, doc, config, vendored), and how much each kind counts for one question.

An editor's question is nearly always about the code itself. Tests and docs repeat the code's
names, so on lexical and semantic evidence alone they crowd the source out of the 12 candidates
(on the outside eval cases they were more than half of the fused top-5 files). Build, packaging
and CI files do the same with every version number and dependency an issue pastes. Fusion
therefore multiplies a test, doc or config chunk's RRF score by a weight below one, unless the
question asks for that kind ("how is the retry tested?", "where is the config documented?",
"why does tox skip py38?"), in which case it counts fully. Weights are settings
(``test_weight``, ``doc_weight``, ``config_weight``); 1.0 turns the rule off.

The roles come from the path alone, so they need no index column and no rebuild.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache

#: RRF multipliers of a test, doc or config chunk when the question does not ask for that kind
#: (settings ``test_weight``, ``doc_weight``, ``config_weight``), chosen on the validation cases.
TEST_WEIGHT = 0.1
DOC_WEIGHT = 0.1
CONFIG_WEIGHT = 0.25
#: The multiplier of vendored source (setting ``vendored_weight``). The 7 validation repositories
#: hold no vendored file; it was set beforehand to the config weight, the other kind of file that
#: matches a question's names without being its answer, and ``bench.quality --cases
#: validation-vendored`` (setuptools) then scored 1, 0.5, 0.25 and 0.1: 0.25 is best, tied with 0.1.
VENDORED_WEIGHT = 0.25

SOURCE = "source"
TEST = "test"
DOC = "doc"
CONFIG = "config"
VENDORED = "vendored"
ROLES = (SOURCE, TEST, DOC, CONFIG, VENDORED)

#: Test folders and the usual test-file names across languages.
_TEST_PATH = re.compile(
    r"(^|/)(tests?|testing|__tests__|spec|specs)/"
    r"|(^|/)test_[^/]*$"
    r"|_tests?\.[A-Za-z0-9]+$"
    r"|\.(test|spec)\.[A-Za-z0-9]+$"
    r"|(^|/)conftest\.py$"
    r"|(^|/)[^/]*Tests?\.(java|kt|cs|swift|scala)$"
)
_DOC_DIR = re.compile(r"(^|/)(docs?|documentation)/")
_DOC_SUFFIXES = (".md", ".markdown", ".rst", ".txt", ".adoc", ".rdoc", ".org", ".po", ".pot")
#: Changelogs and the like without a doc suffix (``CHANGES``, ``CHANGES.old``, ``NEWS``): they
#: repeat every feature and message name, and on the sphinx eval cases they led the fused list.
#: Only bare or ``.old`` names: ``history.py`` stays source.
_DOC_NAME = re.compile(
    r"(^|/)(changes|changelog|history|news|release[-_]?notes|authors|contributors)(\.old)?$", re.IGNORECASE
)

#: Build, packaging and CI: their folders, the usual file names, and data-format suffixes.
_CONFIG_DIR = re.compile(r"(^|/)(\.github|\.circleci|\.gitlab|\.binder|\.devcontainer|ci)/")
_CONFIG_NAME = re.compile(
    r"(^|/)(PKG-INFO|setup\.py|setup\.cfg|tox\.ini|noxfile\.py|pyproject\.toml|MANIFEST\.in|Makefile|"
    r"Dockerfile|\.pre-commit-config\.yaml|\.travis\.yml|\.coveragerc|\.readthedocs\.ya?ml|"
    r"\.?codecov\.ya?ml|environment\.ya?ml|requirements[^/]*\.(txt|in))$",
    re.IGNORECASE,
)
_CONFIG_SUFFIXES = (".yml", ".yaml", ".toml", ".ini", ".cfg", ".lock")

#: Vendored code: the folder names of GitHub Linguist's ``vendor.yml`` ("Vendored dependencies":
#: ``third_party/``, ``3rd-party/``, ``vendor/``, ``vendors/``, ``extern/``, ``external/``; so
#: ``_vendor/`` and ``cextern/`` too), ``vendored/`` (botocore) and ``node_modules/``; plus Python's
#: older convention of whole libraries in a ``packages/`` folder inside a package
#: (``requests/packages/urllib3/``, ``urllib3/packages/backports/``): Python files one folder or
#: more below it only, since a package's own ``packages/`` module folder holds its files directly
#: and a JavaScript monorepo's ``packages/`` holds the project's own code.
_VENDORED_PATH = re.compile(
    r"(third[-_]?party|3rd[-_]?party|vendors?|vendored|extern(al)?)/"
    r"|(^|/)node_modules/"
    r"|[^/]/packages/[^/]+/.*\.py$",
    re.IGNORECASE,
)

#: Words that ask for tests, docs, config or vendored code; "pytest", "docstring", "document", "config" and
#: "install" do not (code questions use them all the time: ``pylint/config/``, "pip install x").
_WANTS_TEST = re.compile(r"\b(tests?|tested|testing|unittests?|fixtures?)\b", re.IGNORECASE)
_WANTS_DOC = re.compile(r"\b(docs?|documentation|documented|readme|changelog|tutorial)\b", re.IGNORECASE)
_WANTS_CONFIG = re.compile(
    r"\b(setup\.py|setup\.cfg|tox(\.ini)?|nox(file)?|pyproject(\.toml)?|manifest\.in|makefile|dockerfile|"
    r"ya?ml|toml|ci|workflows?|github actions|packaging|dependency|dependencies|requirements(\.txt)?|pre-commit)\b",
    re.IGNORECASE,
)
#: "external" and "extern" are left out: questions say "an external command" about the project's own code.
_WANTS_VENDORED = re.compile(r"\b(vendor|vendored|vendoring|third[- ]party|bundled cop(y|ies))\b", re.IGNORECASE)


def file_role(path: str) -> str:
    """``test``, ``doc``, ``config``, ``vendored`` or ``source`` for a workspace-relative path (``/``
    separated). A vendored folder's tests, docs and config keep those roles (their weights are as low)."""
    if _TEST_PATH.search(path):
        return TEST
    if path.lower().endswith(_DOC_SUFFIXES) or _DOC_DIR.search(path) or _DOC_NAME.search(path):
        return DOC
    if path.lower().endswith(_CONFIG_SUFFIXES) or _CONFIG_DIR.search(path) or _CONFIG_NAME.search(path):
        return CONFIG
    if _VENDORED_PATH.search(path):
        return VENDORED
    return SOURCE


def wanted_roles(question: str) -> list[str]:
    """The roles other than source that *question* asks for (``test``, ``doc``, ``config``,
    ``vendored``), in that order."""
    wants = ((TEST, _WANTS_TEST), (DOC, _WANTS_DOC), (CONFIG, _WANTS_CONFIG), (VENDORED, _WANTS_VENDORED))
    return [role for role, pattern in wants if pattern.search(question)]


def role_weights(question: str, test_weight: float, doc_weight: float, config_weight: float = 1.0,
                 vendored_weight: float = 1.0) -> dict[str, float]:
    """The RRF multiplier of each role for *question*; a role the question asks for gets 1.0."""
    wanted = wanted_roles(question)
    given = {TEST: test_weight, DOC: doc_weight, CONFIG: config_weight, VENDORED: vendored_weight}
    return {SOURCE: 1.0, **{role: 1.0 if role in wanted else float(w) for role, w in given.items()}}


@lru_cache(maxsize=16)
def roles_present(paths: frozenset[str]) -> frozenset[str]:
    """The roles that at least one of *paths* has; remembered for the last few path sets (an
    index's paths are one frozenset per table version, so a question does not walk them again)."""
    out: set[str] = set()
    for path in paths:
        out.add(file_role(path))
        if len(out) == len(ROLES):
            break
    return frozenset(out)


def weight_of(path: str, weights: Mapping[str, float] | None) -> float:
    """The multiplier for *path* under *weights* (1.0 without weights or for an unknown role)."""
    if not weights:
        return 1.0
    return float(weights.get(file_role(path), 1.0))
