"""The documentation site's command blocks, run as written in a fresh copy of the checkout.

Every shell block of every page under docs/ carries a `doc-test` marker (tests/docblocks.py, the
mechanism the README's test uses): a tested block runs verbatim, in page order, in that page's own
copy of the checkout (a later block of a page may use what an earlier one left), within its
timeout, and must end as its marker says; a skipped one says why it cannot run here (a real
cluster, an S3 bucket, a Prefect server that stays up, a run id of the reader's own).

A block identical to one of the README's quickstart blocks that tests/docs/test_readme.py runs is
not run a second time here (the same command, minutes of training on kubesim); this test only holds
its marker to the README's, so the page never promises what the README's run does not check.

Pages that read runs (the fleet view, `trainguard runs`) get the data of one real `./dev demo`,
run once for this module and copied into their checkout: nothing is made up, and the demo's minute
is paid once. Nothing is mocked: `./dev`, the demo's temporary Prefect server and the triage are
the real ones.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from checkout_copy import ROOT, copy_checkout, user_env
from docblocks import Block, blocks, run, verdict
from test_readme import _TESTED as README_TESTED

DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
# Pages whose blocks read earlier runs: their copy holds the data of one `./dev demo`.
NEEDS_A_RUN = {"platform/fleet.md", "researchers/results.md"}
DEMO_TIMEOUT = 600


def page_name(page: Path) -> str:
    return page.relative_to(DOCS).as_posix()


def promises(block: Block) -> tuple[object, ...]:
    return block.timeout, block.exit, block.expect, block.skip


_SHELL = [b for page in PAGES for b in blocks(page) if b.is_shell]
_README_RUN = {b.text: b for b in README_TESTED}
_TESTED = [b for b in _SHELL if b.marked and b.skip is None and b.text not in _README_RUN]


def test_every_shell_block_of_every_page_is_tested_or_says_why_not() -> None:
    unmarked = [f"docs/{page_name(b.page)}:{b.line} ({b.heading})" for b in _SHELL if not b.marked]
    assert not unmarked, ("shell blocks without a doc-test marker (add <!-- doc-test: exit=0 "
                          f"timeout=N expect=\"...\" --> or <!-- doc-test: skip=\"why\" --> before each): {unmarked}")
    assert len(_SHELL) >= 20 and len(_TESTED) >= 3
    vague = [b.where for b in _SHELL if b.skip is not None and len(b.skip) < 30]
    assert not vague, f"a skip must say what the block needs that this machine lacks: {vague}"


def test_a_block_the_readme_test_runs_is_not_run_again_and_promises_what_the_readme_checks() -> None:
    again = [b for b in _SHELL if b.text in _README_RUN]
    # at least the Kubernetes quickstart and the two-command blocks of the home page
    assert {page_name(b.page) for b in again} >= {"index.md", "platform/kubernetes.md"}
    differing = [b.where for b in again if promises(b) != promises(_README_RUN[b.text])]
    assert not differing, f"promises that differ from the README's for the same block: {differing}"


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trainguard-data of one real `./dev demo` (a failed attempt, triaged, and a resumed one)."""
    base = tmp_path_factory.mktemp("demo")
    checkout = copy_checkout(base)
    done = subprocess.run(["./dev", "demo"], cwd=checkout, env=user_env(base / "prefect-home"),
                          capture_output=True, text=True, timeout=DEMO_TIMEOUT)
    assert done.returncode == 0 and "succeeded on attempt 2" in done.stdout, _told(done)
    return checkout / "trainguard-data"


def _told(done: subprocess.CompletedProcess[str]) -> str:
    """What a failed command said, for its assertion: its exit code, trainguard's own lines from both
    streams (a server's long traceback would push them out of a tail), then each stream's tail."""
    own = [line for line in (done.stdout + "\n" + done.stderr).splitlines()
           if line.startswith(("trainguard", "error", "Stopped", "Completed", "Failed"))]
    return (f"exit {done.returncode}\n--- trainguard's lines:\n" + "\n".join(own[-40:]) +
            f"\n--- stdout tail:\n{done.stdout[-1500:]}\n--- stderr tail:\n{done.stderr[-1500:]}")


@pytest.fixture(scope="module")
def page_copy(tmp_path_factory: pytest.TempPathFactory,
              request: pytest.FixtureRequest) -> Iterator[Callable[[Path], tuple[Path, dict[str, str]]]]:
    """One fresh copy of the checkout per page, made when the page's first block runs."""
    made: dict[Path, tuple[Path, dict[str, str]]] = {}

    def get(page: Path) -> tuple[Path, dict[str, str]]:
        if page not in made:
            base = tmp_path_factory.mktemp(page_name(page).replace("/", "-").removesuffix(".md"))
            checkout = copy_checkout(base)
            if page_name(page) in NEEDS_A_RUN:
                shutil.copytree(request.getfixturevalue("demo_data"), checkout / "trainguard-data", symlinks=True)
            made[page] = checkout, user_env(base / "prefect-home")
        return made[page]

    yield get


@pytest.mark.parametrize("block", [
    # pytest's own timeout must not cut a block (or the demo before it) short of its bound
    pytest.param(b, id=f"{page_name(b.page)}:{b.line}", marks=pytest.mark.timeout((b.timeout or 0) + DEMO_TIMEOUT + 120))
    for b in _TESTED])
def test_the_block_runs_as_written_and_ends_as_the_page_says(
        block: Block, page_copy: Callable[[Path], tuple[Path, dict[str, str]]]) -> None:
    checkout, env = page_copy(block.page)
    ran = run(block, checkout, env)
    problem = verdict(block, ran)
    assert problem is None, f"docs/{page_name(block.page)}: {problem}"
