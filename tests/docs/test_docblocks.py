"""The doc-test marker mechanism itself: what it reads, what it refuses, and what it says when a
block breaks its promise (ran for real, with bash)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from docblocks import MarkerError, blocks, run, verdict

PAGE = """# Page

Some prose quoting a marker: `<!-- doc-test: exit=0 -->` is not one.

<!-- doc-test: exit=3 timeout=20 expect="hello world" -->
```bash
echo "hello world"   # a comment stays a comment
exit 3
```

## Waits

<!-- doc-test: timeout=1 expect="never" -->
```bash
echo started; sleep 30
```

<!-- doc-test: skip="needs a real cluster" -->
```bash
kubectl apply -k deployments/kubernetes
```

```python
print("not a shell block")
```
"""


def _page(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(text)
    return page


def test_markers_attach_to_the_block_after_them_with_their_heading(tmp_path: Path) -> None:
    found = blocks(_page(tmp_path, PAGE))
    assert [(b.line, b.heading, b.language, b.marked) for b in found] == [
        (6, "Page", "bash", True), (14, "Waits", "bash", True), (19, "Waits", "bash", True),
        (23, "Waits", "python", False)]
    first, _, skipped, _ = found
    assert (first.exit, first.timeout, first.expect) == (3, 20.0, ("hello world",))
    assert skipped.skip == "needs a real cluster" and skipped.timeout is None


def test_a_block_that_keeps_its_promise_passes_and_one_that_overruns_says_what_it_waited_for(
        tmp_path: Path) -> None:
    first, slow, _, _ = blocks(_page(tmp_path, PAGE))
    env = dict(os.environ)
    assert verdict(first, run(first, tmp_path, env)) is None
    ran = run(slow, tmp_path, env)
    assert ran.exit is None and ran.seconds < 10  # ended at its bound, not after the sleep
    problem = verdict(slow, ran)
    assert problem is not None
    assert problem.startswith("page.md:14 (Waits): still running after its timeout of 1 s; it was "
                              "waiting for exit 0, output containing 'never'.")
    assert problem.endswith("Its last lines:\nstarted")


def test_a_broken_promise_names_what_came_instead(tmp_path: Path) -> None:
    page = _page(tmp_path, '<!-- doc-test: timeout=20 expect="Completed" -->\n```bash\necho Failed; false\n```\n')
    block, = blocks(page)
    problem = verdict(block, run(block, tmp_path, dict(os.environ)))
    assert problem is not None and "got exit 1, no 'Completed' in its output" in problem


@pytest.mark.parametrize("text, error", [
    ('<!-- doc-test: exit=0 -->\n```bash\ntrue\n```\n', "without timeout=SECONDS"),
    ('<!-- doc-test: timeout=5 wait=3 -->\n```bash\ntrue\n```\n', "'wait=3' is not one of"),
    ('<!-- doc-test: timeout=five -->\n```bash\ntrue\n```\n', "timeout='five' is not a number"),
    ('<!-- doc-test: timeout=5 -->\nprose\n```bash\ntrue\n```\n', "must come right before a fenced block"),
    ('<!-- doc-test: timeout=5 -->\n', "with no block after it"),
])
def test_a_marker_that_cannot_be_read_is_refused_naming_the_line(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(MarkerError, match=r"^page\.md:1: .*" + error.replace("(", r"\(").replace(")", r"\)")):
        blocks(_page(tmp_path, text))
