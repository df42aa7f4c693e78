"""The README's quickstarts (two commands, one's own script, Kubernetes), run as written in a fresh copy of the checkout.

Every shell block of those sections carries a `doc-test` marker (tests/docblocks.py): the tested ones
run verbatim, in page order, in one copy (a later block may use what an earlier one left), each
within its timeout, and must end as the marker says; the others say why they cannot run here. The
Kubernetes blocks run on kubesim, as the text says. Nothing is mocked: `./dev`, Prefect's temporary
server, kubesim, kubectl and torchrun are the real ones (the GPUs are the one thing kubesim stands
in for).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from checkout_copy import ROOT, copy_checkout, stop_kubesim, user_env
from docblocks import Block, blocks, run, verdict

README = ROOT / "README.md"
QUICKSTART_SECTIONS = ("Two commands", "Your own training script in five minutes", "Kubernetes quickstart")
_ALL = blocks(README)
_QUICK = [b for b in _ALL if b.heading in QUICKSTART_SECTIONS and b.is_shell]
_TESTED = [b for b in _QUICK if b.marked and b.skip is None]


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    base = tmp_path_factory.mktemp("readme")
    checkout = copy_checkout(base)
    env = user_env(base / "prefect-home")
    try:
        yield checkout, env
    finally:  # a block that failed halfway may have left kubesim running
        stop_kubesim(checkout, env)


def test_every_quickstart_shell_block_is_tested_or_says_why_not() -> None:
    assert {b.heading for b in _QUICK} == set(QUICKSTART_SECTIONS)
    unmarked = [b.where for b in _QUICK if not b.marked]
    assert not unmarked, f"shell blocks without a doc-test marker: {unmarked}"
    assert len(_TESTED) >= 4


@pytest.mark.parametrize("block", [
    # pytest's own timeout must not cut a block short of the bound its marker gives it
    pytest.param(b, id=f"line{b.line}", marks=pytest.mark.timeout((b.timeout or 0) + 120)) for b in _TESTED])
def test_the_block_runs_as_written_and_ends_as_the_text_says(block: Block,
                                                             fresh: tuple[Path, dict[str, str]]) -> None:
    checkout, env = fresh
    ran = run(block, checkout, env)
    problem = verdict(block, ran)
    assert problem is None, problem


def test_the_kubernetes_blocks_use_the_namespace_the_manifests_create() -> None:
    manifests = subprocess.run(["kubectl", "kustomize", str(ROOT / "deployments" / "kubernetes")],
                               check=True, capture_output=True, text=True).stdout
    created = re.findall(r"^kind: Namespace\nmetadata:\n  name: (\S+)", manifests, re.M)
    used = {m for b in _QUICK for m in re.findall(r"--namespace (\S+)", b.text)}
    assert created == ["trainguard"] and used == {"trainguard"}
    # every namespaced object is in it, but the node-events grant, which must sit where nodes' events are
    placed = set(re.findall(r"^  namespace: (\S+)", manifests, re.M))
    assert placed == {"trainguard", "default"}
