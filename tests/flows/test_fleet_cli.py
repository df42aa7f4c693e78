"""`trainguard fleet` over generated verdict histories kept in the real stores: a folder, and S3 (moto on loopback)
through a saved block; `--markdown` publishes to the session's real Prefect server, `--apply` edits its Variable."""

from __future__ import annotations

import json
import sys
import uuid
from types import SimpleNamespace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from prefect.variables import Variable
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parents[1] / "fleet"))
from histories import START, attempt  # noqa: E402
from histories import fleet as generated  # noqa: E402

from blocks.evidence import S3EvidenceStore  # noqa: E402
from trainguard.cli import app  # noqa: E402
from trainguard.core.evidence import index  # noqa: E402
from trainguard.core.fleet.avoid import VARIABLE  # noqa: E402
from trainguard.core.stores.folder import LocalEvidenceStore  # noqa: E402

runner = CliRunner()
NOW = datetime.now(UTC)
HOSTILE_NODE = "[bold red]gpu-x[/] \x1b[2J\x1b]0;pwned\x07 | <script>x</script> [link](javascript:alert(1))"
HOSTILE_LINE = "\x1b[31mRuntimeError\x1b[0m [red]boom[/red] | <img src=x onerror=alert(1)> **bold** `tick"


def keep_history(store, history) -> None:
    """Write each verdict's index record as an attempt would, at its time."""
    for summary, when in history:
        index.keep(store, summary, when)


def fleet(**kw) -> list:
    """The generated fleet's ten days moved to the last ten days."""
    return [(summary, NOW - timedelta(days=10, hours=1) + (when - START)) for summary, when in generated(**kw)]


def small_node() -> list:
    return [(attempt(f"small-{k}", 1, "gpu-99", c), NOW - timedelta(hours=1))
            for k, c in enumerate(["gpu_fault", "nccl_error", None])]


@pytest.fixture
def s3_block(prefect_server, s3, tmp_path):
    block = S3EvidenceStore(bucket=s3.new_bucket(), prefix="ev", region="us-east-1", endpoint_url=s3.proxy.url,
                            spool_dir=str(tmp_path / "spool"), retry_attempts=2, retry_base_delay_seconds=0.01)
    name = f"s3-{uuid.uuid4().hex[:8]}"
    block.save(name)
    return f"trainguard-s3-evidence-store/{name}", block


def test_the_planted_bad_node_is_suggested_from_a_folder_and_a_small_sample_is_not(tmp_path: Path) -> None:
    store = LocalEvidenceStore(tmp_path / "evidence")
    keep_history(store, [*fleet(), *small_node()])

    shown = runner.invoke(app, ["fleet", "--since", "30d", "--root", str(tmp_path / "evidence")])
    as_json = runner.invoke(app, ["fleet", "--since", "30d", "--root", str(tmp_path / "evidence"), "--json"])

    assert shown.exit_code == 0, shown.output
    suggested = shown.output.split("suggested actions")[1].split("nodes")[0]
    assert "gpu-07" in suggested and "gpu-99" not in suggested
    data = json.loads(as_json.output)
    assert [s["node"] for s in data["suspects"]] == ["gpu-07"]
    assert data["suspects"][0]["p_value"] <= data["suspects"][0]["threshold"]
    small = next(row for row in data["nodes"] if row["node"] == "gpu-99")
    assert (small["attempts"], sum(small["failures"].values())) == (3, 2)
    assert data["totals"]["attempts"] == 50 * 40 + 3


def test_the_same_from_s3_through_a_saved_block_with_the_closed_days_compacted(s3_block, s3) -> None:
    reference, block = s3_block
    keep_history(block.store(), [*fleet(nodes=10), *small_node()])  # the store's path, not the statistics: 10 nodes

    shown = runner.invoke(app, ["fleet", "--since", "30d", "--block", reference, "--json"])

    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.output)
    assert [s["node"] for s in data["suspects"]] == ["gpu-07"] and data["totals"]["attempts"] == 10 * 40 + 3
    closed = (NOW - timedelta(days=5)).date().isoformat()
    assert [k.rsplit("/", 1)[1][:10] for k in s3.objects(block.bucket) if f"/{closed}/" in k] == ["compacted-"]
    again = runner.invoke(app, ["fleet", "--since", "30d", "--block", reference, "--json"])
    assert json.loads(again.output)["nodes"] == data["nodes"]


def test_a_fingerprint_recurring_in_three_runs_on_three_nodes_is_one_row(tmp_path: Path) -> None:
    store = LocalEvidenceStore(tmp_path / "evidence")
    keep_history(store, [(attempt(f"run-{n}", 1, f"gpu-0{n}", "nccl_error", fingerprint="fp-watchdog"),
                          NOW - timedelta(days=n)) for n in range(3)])

    shown = runner.invoke(app, ["fleet", "--root", str(tmp_path / "evidence"), "--json"])

    (row,) = json.loads(shown.output)["fingerprints"]
    assert (row["fingerprint"], row["runs"], row["nodes"]) == ("fp-watchdog", 3, ["gpu-00", "gpu-01", "gpu-02"])


def test_hostile_node_names_and_lines_are_inert_in_the_tables(tmp_path: Path) -> None:
    store = LocalEvidenceStore(tmp_path / "evidence")
    keep_history(store, [(attempt(f"r{k}", 1, HOSTILE_NODE, "gpu_fault", fingerprint="fp", signature=HOSTILE_LINE),
                          NOW - timedelta(hours=k)) for k in range(3)])

    shown = runner.invoke(app, ["fleet", "--root", str(tmp_path / "evidence")], terminal_width=400)

    assert shown.exit_code == 0, shown.output
    assert "\x1b" not in shown.output and "\x07" not in shown.output
    assert "[bold red]gpu-x[/]" in shown.output and "[red]boom[/red]" in shown.output  # printed, not obeyed


def test_bad_since_is_one_line_naming_the_option(tmp_path: Path) -> None:
    for since in ("7", "seven days", "0d", "999w"):
        shown = runner.invoke(app, ["fleet", "--since", since, "--root", str(tmp_path)])
        assert shown.exit_code == 2 and shown.output.count("\n") == 1 and "--since" in shown.output, shown.output


def test_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    shown = runner.invoke(app, ["fleet", "--root", str(tmp_path / "nowhere")])
    assert shown.exit_code == 2 and shown.output.startswith("error: --root") and shown.output.count("\n") == 1


def test_markdown_publishes_the_artifact_with_everything_escaped(prefect_server, tmp_path: Path) -> None:
    store = LocalEvidenceStore(tmp_path / "evidence")
    hostile = [(attempt(f"h{k}", 1, HOSTILE_NODE, "gpu_fault", fingerprint="fp-h", signature=HOSTILE_LINE),
                NOW - timedelta(hours=k)) for k in range(3)]
    keep_history(store, [*fleet(), *hostile])

    shown = runner.invoke(app, ["fleet", "--since", "30d", "--root", str(tmp_path / "evidence"), "--markdown"])

    assert shown.exit_code == 0, shown.output
    with get_client(sync_client=True) as client:
        (latest,) = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["trainguard-fleet"])),
                                          sort="CREATED_DESC", limit=1)
    text = str(latest.data)
    assert "avoid **gpu-07**" in text
    for raw in ("<script>", "<img", "](javascript:", "\x1b", "\x07", "**bold**", "[red]boom[/red]"):
        assert raw not in text, raw
    assert "&lt;script&gt;" in text and "\\[red\\]boom\\[/red\\]" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "gpu-x" in line]
    assert rows and all(line.count("|") in (8, 9) for line in rows)  # 7 or 8 cells: no pipe of theirs splits one


def test_apply_adds_the_suspect_to_the_shared_avoid_list(prefect_server, tmp_path: Path) -> None:
    store = LocalEvidenceStore(tmp_path / "evidence")
    keep_history(store, list(fleet()))
    Variable.set(VARIABLE, [{"node": "gpu-33", "reason": "by hand", "expires_at": "2099-01-01T00:00:00Z",
                             "added_by": "alice"}], overwrite=True)

    shown = runner.invoke(app, ["fleet", "--since", "30d", "--root", str(tmp_path / "evidence"), "--apply",
                                "--avoid-days", "3"])

    assert shown.exit_code == 0, shown.output
    entries = {e["node"]: e for e in Variable.get(VARIABLE)}
    assert set(entries) == {"gpu-33", "gpu-07"} and entries["gpu-33"]["added_by"] == "alice"
    expires = datetime.fromisoformat(entries["gpu-07"]["expires_at"].replace("Z", "+00:00"))
    assert timedelta(days=2.9) < expires - NOW < timedelta(days=3.1)
    assert "hardware failures in" in entries["gpu-07"]["reason"] and "trainguard fleet" in entries["gpu-07"]["added_by"]
    Variable.unset(VARIABLE)


def listed(node: str, added_by: str) -> dict[str, str]:
    return {"node": node, "reason": "by hand", "expires_at": "2099-01-01T00:00:00Z", "added_by": added_by}


def test_apply_keeps_an_edit_made_in_the_ui_while_it_ran_and_says_so(prefect_server, tmp_path: Path,
                                                                       monkeypatch) -> None:
    """bob removes alice's entry and adds his own while the command reads the index (after it read the list)."""
    store = LocalEvidenceStore(tmp_path / "evidence")
    keep_history(store, list(fleet()))
    Variable.set(VARIABLE, [listed("gpu-33", "alice")], overwrite=True)
    reading = index.IndexReader.records

    def records_while_bob_edits(self, *args, **kwargs):
        Variable.set(VARIABLE, [listed("gpu-44", "bob")], overwrite=True)
        return reading(self, *args, **kwargs)

    monkeypatch.setattr(index.IndexReader, "records", records_while_bob_edits)

    shown = runner.invoke(app, ["fleet", "--since", "30d", "--root", str(tmp_path / "evidence"), "--apply"],
                          terminal_width=400)

    assert shown.exit_code == 0, shown.output
    assert {e["node"] for e in Variable.get(VARIABLE)} == {"gpu-44", "gpu-07"}  # alice's stays removed
    (merged,) = [line for line in shown.output.splitlines() if "while this ran" in line]
    assert "gpu-44 added by bob" in merged and "gpu-33 removed" in merged and "gpu-07" not in merged
    Variable.unset(VARIABLE)


def test_apply_adds_its_nodes_again_when_a_stale_copy_is_written_over_them(prefect_server, tmp_path: Path,
                                                                           monkeypatch) -> None:
    """carol's tool read the list before --apply wrote it and writes its copy back right after."""
    import tasks.fleet

    store = LocalEvidenceStore(tmp_path / "evidence")
    keep_history(store, list(fleet()))
    Variable.set(VARIABLE, [listed("gpu-33", "alice")], overwrite=True)
    writes: list[list[str]] = []

    def set_then_carol_writes(name: str, value, overwrite: bool = False):
        Variable.set(name, value, overwrite=overwrite)
        writes.append([e["node"] for e in value])
        if len(writes) == 1:
            Variable.set(VARIABLE, [listed("gpu-33", "alice"), listed("gpu-55", "carol")], overwrite=True)

    monkeypatch.setattr(tasks.fleet, "Variable", SimpleNamespace(get=Variable.get, set=set_then_carol_writes))

    shown = runner.invoke(app, ["fleet", "--since", "30d", "--root", str(tmp_path / "evidence"), "--apply"],
                          terminal_width=400)

    assert shown.exit_code == 0, shown.output
    assert writes == [["gpu-33", "gpu-07"], ["gpu-33", "gpu-55", "gpu-07"]]
    assert [e["node"] for e in Variable.get(VARIABLE)] == ["gpu-33", "gpu-55", "gpu-07"]
    assert "gpu-55 added by carol" in shown.output
    Variable.unset(VARIABLE)


def test_apply_refuses_a_mistyped_list_in_one_line(prefect_server, tmp_path: Path) -> None:
    store = LocalEvidenceStore(tmp_path / "evidence")
    keep_history(store, list(fleet()))
    Variable.set(VARIABLE, [{"node": "gpu-33", "expires_at": "next tuesday"}], overwrite=True)

    shown = runner.invoke(app, ["fleet", "--since", "30d", "--root", str(tmp_path / "evidence"), "--apply",
                                "--json"])

    assert shown.exit_code == 2
    last = shown.output.strip().splitlines()[-1]
    assert last.startswith("error: --apply: trainguard-avoid-nodes[0].expires_at:") and "ISO-8601" in last
    Variable.unset(VARIABLE)


def test_the_fleet_report_flow_emits_one_event_per_suspect_node_with_its_evidence(prefect_server,
                                                                                   tmp_path: Path) -> None:
    from prefect.events.filters import EventFilter, EventNameFilter
    from prefect.events.worker import EventsWorker
    from waiting import wait_for

    from flows.fleet import SUSPECT_NODE, fleet_report

    EventsWorker.drain_all(timeout=5)  # bound to this server, whatever a test before sent to
    store = LocalEvidenceStore(tmp_path / "evidence")
    keep_history(store, [*fleet(), *small_node()])
    started = datetime.now(UTC)

    done = fleet_report(since_hours=24 * 30, root=str(tmp_path / "evidence"))

    assert done["suspects"] == ["gpu-07"]

    def emitted() -> list:
        with get_client(sync_client=True) as client:
            page = client.read_events(EventFilter(event=EventNameFilter(name=[SUSPECT_NODE])), limit=50)
        return [e for e in page.events if e.occurred >= started]

    (event,) = wait_for(emitted, timeout=30, what="the suspect-node event on the server")
    assert event.resource["trainguard.node"] == "gpu-07"
    assert event.payload["node"] == "gpu-07" and event.payload["p_value"] <= event.payload["threshold"]
    assert event.payload["hardware_failures"] >= 3 and len(event.payload["examples"]) == 3


def test_apply_drops_the_expired_entries_so_a_long_used_list_still_takes_new_nodes(prefect_server,
                                                                                    tmp_path: Path) -> None:
    """Forty nodes added over the months, all expired: with one more, over a Variable's 5,000 characters."""
    store = LocalEvidenceStore(tmp_path / "evidence")
    keep_history(store, list(fleet()))
    old = [{"node": f"gpu-old-{n:02d}", "reason": "2 hardware failures in 9 attempts", "added_by": "alice",
            "expires_at": "2026-01-01T00:00:00Z"} for n in range(40)]
    Variable.set(VARIABLE, old, overwrite=True)

    shown = runner.invoke(app, ["fleet", "--since", "30d", "--root", str(tmp_path / "evidence"), "--apply"],
                          terminal_width=400)

    assert shown.exit_code == 0, shown.output
    assert [e["node"] for e in Variable.get(VARIABLE)] == ["gpu-07"]
    Variable.unset(VARIABLE)
