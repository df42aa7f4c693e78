"""Pictures of the Prefect UI for the README: a retried run's flow run page and its run report.

Starts its own Prefect server on a free loopback port (UI on, its build written to a temporary
folder, not into site-packages), runs the demo (attempt 1 dies of an NCCL timeout, attempt 2
resumes and succeeds), and photographs two pages with headless Chromium from Debian's `chromium`
package: the training-run flow run with its attempts, and the run's report artifact.

    .venv/bin/python docs/screenshots.py [--out docs] [--server http://127.0.0.1:4200]

With `--server`, it uses that running Prefect server (started with PREFECT_UI_API_URL set) instead.

Everything it starts it stops; nothing is left in the checkout but the PNGs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--virtual-time-budget=25000"]
RENDERS = 3  # tries at a page the UI had not finished drawing


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until_up(url: str, server: subprocess.Popen[bytes] | None, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server is not None and server.poll() is not None:
            raise SystemExit(f"the Prefect server exited with {server.returncode}; see its log")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"the Prefect server at {url} did not answer within {timeout:g}s")


def check_ui(base: str) -> None:
    """Stop with one line when the server shows no UI, or a UI that would call another API address."""
    import json

    try:
        with urllib.request.urlopen(f"{base}/ui-settings", timeout=10) as answer:
            api_url = json.loads(answer.read()).get("api_url", "")
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--server {base}: it serves no Prefect UI ({exc}); "
                         "start it with PREFECT_UI_ENABLED=true") from None
    if api_url.rstrip("/") != f"{base}/api":
        raise SystemExit(f"--server {base}: its UI calls the API at {api_url!r}, so pages would say \"Can't connect\"; "
                         f"start the server with PREFECT_UI_API_URL={base}/api")


def start_server(tmp: Path, port: int) -> subprocess.Popen[bytes]:
    api = f"http://127.0.0.1:{port}/api"
    os.environ.update(PREFECT_API_URL=api, PREFECT_UI_API_URL=api, PREFECT_HOME=str(tmp / "home"),
                      PREFECT_SERVER_UI_STATIC_DIRECTORY=str(tmp / "ui"), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    log = (tmp / "server.log").open("wb")
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                               "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_until_up(api, server)
    return server


def run_demo(workdir: Path) -> tuple[str, str, str]:
    """Run the demo against the server; (training-run flow run id, report artifact id, run id)."""
    os.chdir(workdir)  # the demo's work and evidence folders land in the temporary folder
    from prefect.artifacts import Artifact

    from flows.notebook import run_training
    from trainguard.demo import demo_spec

    spec = demo_spec(steps=60, fail_at_step=35, delay_seconds=1)
    spec["name"], spec["gpus"] = "resnet-nightly", 8  # a cost figure for the report; no GPU is used
    run = run_training(spec)
    if not run.succeeded:
        raise SystemExit(f"the demo run did not succeed: {run.state}: {run.message}")
    parent = run.attempts[0].flow_run_id
    from prefect import get_client

    with get_client(sync_client=True) as client:
        parent_id = client.read_flow_run(parent).parent_task_run_id
        attempt = client.read_flow_run(parent)
        training = client.read_task_run(parent_id).flow_run_id if parent_id else attempt.id
    artifact = Artifact.get(f"{run.run_id}-report", _sync=True)  # type: ignore[call-arg]
    return str(training), str(artifact.id), run.run_id


def shoot(chromium: str, url: str, out: Path, size: str, tmp: Path, shows: tuple[str, ...] = ()) -> None:
    """Photograph `url`; stop with one line unless the rendered page holds every text of `shows`.

    The check renders the page a second time (--dump-dom), so it is made where words matter: the
    run page's attempts are drawn on a canvas, which holds no text to check.
    A page the UI had not finished drawing within Chromium's time budget (a loaded machine) is
    photographed again, up to ``RENDERS`` times, picture and check together.
    """
    missing: list[str] = []
    for _ in range(RENDERS):
        profile = Path(tempfile.mkdtemp(dir=tmp, prefix="chromium-"))
        flags = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={size}"]
        subprocess.run([*flags, f"--screenshot={out}", url], check=True, timeout=180,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not out.exists() or out.stat().st_size < 10_000:
            raise SystemExit(f"chromium wrote no usable picture of {url}")
        if not shows:
            return
        page = subprocess.run([*flags, "--dump-dom", url], check=True, timeout=180, capture_output=True,
                              text=True, errors="replace").stdout
        if not (missing := [text for text in shows if text not in page]):
            return
    raise SystemExit(f"the page {url} does not show {missing} in {RENDERS} renders: the picture would not either")


def stop(server: subprocess.Popen[bytes]) -> None:
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    parser.add_argument("--server", help="a running Prefect server's address (default: start one)")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium: not found; install Debian's package: apt-get install chromium")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="trainguard-screens-") as name:
        tmp = Path(name)
        if args.server:
            base, server = args.server.rstrip("/"), None
            os.environ.update(PREFECT_API_URL=f"{base}/api", PREFECT_SERVER_ANALYTICS_ENABLED="false")
            wait_until_up(f"{base}/api", None)
            check_ui(base)
        else:
            port = free_port()
            base, server = f"http://127.0.0.1:{port}", start_server(tmp, port)
        try:
            flow_run_id, artifact_id, run_id = run_demo(tmp)
            shoot(chromium, f"{base}/runs/flow-run/{flow_run_id}", out / "ui-retried-run.png", "1400,900", tmp)
            # wide enough for the timeline's last column ("then": what came next)
            shoot(chromium, f"{base}/artifacts/artifact/{artifact_id}", out / "ui-run-report.png", "2000,1000", tmp,
                  shows=(f"Run {run_id}: succeeded on attempt 2", "Timeline", "then", "Progress per attempt"))
        finally:
            if server is not None:
                stop(server)
    print(f"wrote {out / 'ui-retried-run.png'} and {out / 'ui-run-report.png'}")


if __name__ == "__main__":
    main()
