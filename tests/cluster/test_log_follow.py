"""Following several pods' logs at once, as a supervisor of a multi-pod attempt does.

Oracle: the pods/log subresource with `follow=true` streams a container's output "until the
container ends" (kubectl logs -f), independently per request. The official client follows
every pod of an Indexed Job from its own thread; each stream must carry all of its pod's
lines and end when that pod's container ends, not when another's does.
"""

from __future__ import annotations

import threading
from pathlib import Path

from kubernetes import client
from waiting import wait_for

PODS = 4
# Pod k prints 10 * (k + 1) lines, 20 ms apart; the last pod then waits (bounded) until the
# file named by argv[1] exists, so its stream must stay open while the others end.
TALKER = ("import os, sys, time\nk = int(os.environ['JOB_COMPLETION_INDEX'])\n"
          "for i in range(10 * (k + 1)):\n    print(f'line {i}', flush=True)\n"
          "    time.sleep(0.02)\nend = time.time() + 60\n"
          f"while k == {PODS - 1} and not os.path.exists(sys.argv[1]) and time.time() < end:\n"
          "    time.sleep(0.05)\n")


def _follow(core: client.CoreV1Api, ns: str, name: str, out: dict[str, str]) -> None:
    response = core.read_namespaced_pod_log(name, ns, follow=True, _preload_content=False)
    out[name] = b"".join(response.stream(1024)).decode()


def test_concurrent_follows_each_stream_a_whole_log_and_end_with_their_container(
        core: client.CoreV1Api, batch: client.BatchV1Api, ns: str, tmp_path: Path) -> None:
    release = tmp_path / "release"
    batch.create_namespaced_job(ns, {"metadata": {"name": "talk"}, "spec": {
        "completionMode": "Indexed", "completions": PODS, "parallelism": PODS,
        "template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "main", "image": "python:3.11",
             "command": ["python", "-c", TALKER, str(release)]}]}}}})

    def all_started() -> list[client.V1Pod] | None:
        pods = core.list_namespaced_pod(ns, label_selector="job-name=talk").items
        started = [p for p in pods if (p.status.container_statuses or [None])[0]
                   and (p.status.container_statuses[0].state.running
                        or p.status.container_statuses[0].state.terminated)]
        return pods if len(started) == PODS else None

    index = {p.metadata.name: int(p.metadata.annotations[
        "batch.kubernetes.io/job-completion-index"]) for p in wait_for(
            all_started, what="every container started")}
    out: dict[str, str] = {}
    threads = {name: threading.Thread(target=_follow, args=(core, ns, name, out))
               for name in index}
    for thread in threads.values():
        thread.start()
    last = next(name for name, k in index.items() if k == PODS - 1)
    for name, thread in threads.items():
        if name != last:
            thread.join(timeout=30)
            assert not thread.is_alive(), f"the follow of {name} outlived its container"
    assert threads[last].is_alive()  # its container still runs, so its stream stays open
    release.touch()
    threads[last].join(timeout=30)
    assert not threads[last].is_alive()
    for name, k in index.items():
        assert out[name] == "".join(f"line {i}\n" for i in range(10 * (k + 1)))
        assert core.read_namespaced_pod(name, ns).status.phase == "Succeeded"
