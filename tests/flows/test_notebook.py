"""The example notebook, executed cell by cell in a real Jupyter kernel against the test server."""

from __future__ import annotations

import nbformat
from flow_helpers import ROOT
from nbclient import NotebookClient

NOTEBOOK = ROOT / "examples" / "run_from_a_notebook.ipynb"


def _outputs(cell) -> str:
    parts = []
    for output in cell.get("outputs", []):
        parts.append(output.get("text", ""))
        parts.extend(str(v) for v in output.get("data", {}).values())
    return "\n".join(parts)


def test_the_example_notebook_runs_in_a_jupyter_kernel_and_shows_attempts_and_report(prefect_server, tmp_path, monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", prefect_server)  # the kernel inherits it
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    monkeypatch.delenv("TRAINGUARD_HOME", raising=False)
    checkout = tmp_path / "checkout"  # Jupyter runs the notebook in its folder: examples/ of a checkout
    (checkout / "examples").mkdir(parents=True)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(checkout / "examples")}}).execute()

    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert "Completed" in _outputs(code[1])
    table = _outputs(code[2]).replace("\\_", "_")  # Markdown escapes the underscores
    assert "| attempt |" in table and "nccl_error" in table and "Completed" in table
    report = _outputs(code[3])
    assert "# Run notebook-demo-" in report and "## Timeline" in report and "✗ steps" in report
    outputs = "\n".join(_outputs(cell) for cell in code)
    assert "<coroutine object" not in outputs and "was never awaited" not in outputs  # values, not coroutines
    assert "('nccl_error', 'step-000020.json')" in _outputs(code[4])
    # the run went to the checkout's data root, where `./dev runs` looks, not to examples/trainguard-data
    assert (checkout / "trainguard-data" / "evidence" / "runs").is_dir()
    assert not (checkout / "examples" / "trainguard-data").exists()
