"""What the README and docs point at exists: relative links, and the benchmark results bench/README.md cites.

The README sends a newcomer to docs/ for everything but the first steps, so a link that
breaks when a file moves is a dead end; benchmark outputs are tracked only when
bench/README.md cites them (new ones are ignored by git), so a cited file must be tracked
and a tracked one cited.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
import shutil
import subprocess

import pytest

from tests.support.hostile_dumps import REPO

DOCUMENTS = ["README.md", "bench/README.md", "examples/README.md", "examples/ascend/README.md", "docs/*.md"]


def _documents():
    for pattern in DOCUMENTS:
        yield from sorted(glob.glob(os.path.join(REPO, pattern)))


def _prose(path: str) -> str:
    """The document without code blocks and inline code (where brackets are code, not links)."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    return re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))


README_MAX_LINES = 250  # what a newcomer reads before docs/ takes over


def test_the_readme_stays_short_enough_for_a_first_read():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; keep it at most {README_MAX_LINES} and move detail to docs/")


def test_every_relative_link_in_the_readme_and_docs_resolves():
    broken = []
    for path in _documents():
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(path)):
            if re.match(r"[a-z]+://|mailto:|#", target):
                continue
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), target.split("#")[0]))
            if not os.path.exists(resolved):
                broken.append(f"{os.path.relpath(path, REPO)}: {target}")
    assert not broken, "links to nothing: " + "; ".join(broken)


def _tracked_results():
    if shutil.which("git") is None or not os.path.exists(os.path.join(REPO, ".git")):
        pytest.skip("not a git checkout: which files are tracked is unknown")
    listing = subprocess.run(["git", "ls-files", "bench/results"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout
    return [os.path.basename(line) for line in listing.split()]


def _citations():
    with open(os.path.join(REPO, "bench", "README.md"), encoding="utf-8") as handle:
        text = handle.read()
    named = {g for g in re.findall(r"results/([A-Za-z0-9_.*-]+)", text) if "DATE" not in g}
    # "runs 1 and 2: `-011007`, `-013847`" names capture runs by their time (and tag) only
    short = set(re.findall(r"`(-\d{6}(?:-[a-z-]+)?)`", text))
    return text, named, short


def _cited(name: str, text: str, named, short) -> bool:
    stem = name.split(".")[0]
    return (stem in text or any(fnmatch.fnmatch(name, g) or fnmatch.fnmatch(name, g + ".*") for g in named)
            or any(re.fullmatch(r"capture-\d{8}" + re.escape(s), stem) for s in short))


def test_every_tracked_benchmark_result_is_cited_by_bench_readme():
    text, named, short = _citations()
    uncited = [name for name in _tracked_results() if not _cited(name, text, named, short)]
    assert not uncited, f"tracked but not cited by bench/README.md (cite them or delete them): {uncited}"


def test_every_benchmark_result_bench_readme_cites_is_tracked():
    tracked = _tracked_results()
    _, named, _ = _citations()
    missing = [g for g in sorted(named)
               if not any(fnmatch.fnmatch(name, g) or fnmatch.fnmatch(name, g + ".*") for name in tracked)]
    assert not missing, f"bench/README.md cites results/ files that are not tracked (git add -f them): {missing}"
