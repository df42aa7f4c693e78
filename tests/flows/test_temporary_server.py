"""The temporary Prefect server `trainguard run` starts: it must be the one answering on its own port.

Prefect picks a random free port and starts uvicorn, which binds only after seconds of start-up;
another temporary server (a second `trainguard run` on the machine) can take that port meanwhile and
answer the health check. Here a stand-in answers on the port Prefect is made to pick first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import http.server, json, socket, sys, threading
from prefect.server.api.server import SubprocessASGIServer
from trainguard.cli import server as temporary

class Health(http.server.BaseHTTPRequestHandler):  # another run's server, as far as a health check can tell
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Type", "application/json"); self.end_headers()
        self.wfile.write(b"true")
    def log_message(self, *args):
        pass

other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
threading.Thread(target=other.serve_forever, daemon=True).start()
taken = other.server_address[1]
picked = SubprocessASGIServer.find_available_port
picks = []
def pick(self):
    picks.append(taken if not picks else picked(self))
    return picks[-1]
SubprocessASGIServer.find_available_port = pick
pid = temporary.start_temporary_server()
server = SubprocessASGIServer()  # the instance Prefect's client takes its URL from
import httpx
version = httpx.get(f"{server.api_url}/admin/version").json()  # the stand-in answers true to anything
print(json.dumps({"taken": taken, "port": server.port, "pid": pid, "ours": server.server_process.pid,
                  "version": version}))
sys.stdout.flush()
server.stop()
"""


def test_a_port_taken_by_another_server_while_the_temporary_server_starts_is_left_for_another(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["port"] != got["taken"] and got["pid"] == got["ours"] and isinstance(got["version"], str), got
    assert f"port {got['taken']} was taken by another server" in done.stderr, done.stderr[-2000:]
