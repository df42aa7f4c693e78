"""API faults as the official client sees them: error statuses, slow answers, broken, ended and
expired watches, and the request log that counts a client's calls."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
import urllib3
from cluster_helpers import seeded_pod
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from kubernetes_asyncio import client as aclient
from kubernetes_asyncio import config as aconfig
from kubernetes_asyncio import watch as awatch

import kubesim.fixture
from waiting import wait_for


@pytest.fixture(autouse=True)
def no_faults_left(sim: kubesim.fixture.Sim) -> Iterator[None]:
    yield
    sim.faults.clear()


@pytest.mark.parametrize("code", [500, 503, 504])
def test_error_rule_answers_matching_requests_then_stops(sim: kubesim.fixture.Sim,
                                                         core: client.CoreV1Api, ns: str,
                                                         code: int) -> None:
    sim.faults.add(verb="list", resource="pods", namespace=ns, status=code, times=2)
    for _ in range(2):
        with pytest.raises(ApiException) as err:
            core.list_namespaced_pod(ns)
        assert err.value.status == code
    assert core.list_namespaced_pod(ns).items == []
    assert [r["code"] for r in sim.requests(verb="list", namespace=ns)] == [code, code, 200]


def test_too_many_requests_carries_retry_after(sim: kubesim.fixture.Sim, core: client.CoreV1Api,
                                               ns: str) -> None:
    sim.faults.add(verb="create", resource="pods", namespace=ns, status=429, retry_after=7,
                   times=1)
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(ns, seeded_pod("p"))
    assert err.value.status == 429 and err.value.headers["Retry-After"] == "7"
    assert '"reason":"TooManyRequests"' in err.value.body


def test_other_requests_are_untouched_by_a_rule(sim: kubesim.fixture.Sim, core: client.CoreV1Api,
                                                ns: str) -> None:
    sim.faults.add(verb="get", resource="pods", namespace=ns, name="p", status=500)
    core.create_namespaced_pod(ns, seeded_pod("p"))
    core.create_namespaced_pod(ns, seeded_pod("q"))
    assert core.read_namespaced_pod("q", ns).metadata.name == "q"
    with pytest.raises(ApiException):
        core.read_namespaced_pod("p", ns)


def test_slow_answer_trips_a_client_timeout(sim: kubesim.fixture.Sim, core: client.CoreV1Api,
                                            ns: str) -> None:
    sim.faults.add(verb="list", resource="pods", namespace=ns, delay=1.0)
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.HTTPError):
        core.list_namespaced_pod(ns, _request_timeout=0.2)
    assert time.monotonic() - started < 3
    assert sim.requests(verb="list", namespace=ns)


def _watch_names(core: client.CoreV1Api, ns: str, seconds: int) -> list[str]:
    return [e["type"] for e in watch.Watch().stream(core.list_namespaced_pod, ns,
                                                     timeout_seconds=seconds)]


def test_reset_watch_breaks_the_official_clients_stream(sim: kubesim.fixture.Sim,
                                                        core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_pod(ns, seeded_pod("p"))
    sim.faults.add(verb="watch", resource="pods", namespace=ns, watch="reset", after=0.3)
    with pytest.raises(urllib3.exceptions.ProtocolError):
        _watch_names(core, ns, 5)


def test_ended_watch_is_a_clean_end_before_the_timeout(sim: kubesim.fixture.Sim,
                                                      core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_pod(ns, seeded_pod("p"))
    sim.faults.add(verb="watch", resource="pods", namespace=ns, watch="end", after=0.3)
    started = time.monotonic()
    assert _watch_names(core, ns, 5) == ["ADDED"]
    assert time.monotonic() - started < 2


@pytest.mark.parametrize(("timeout", "watches"), [(None, 2), (5, 1)])
def test_expired_watch_raises_410_after_the_clients_own_retry(
        sim: kubesim.fixture.Sim, core: client.CoreV1Api, ns: str, timeout: int | None,
        watches: int) -> None:
    rv = core.list_namespaced_pod(ns).metadata.resource_version
    sim.faults.add(verb="watch", resource="pods", namespace=ns, watch="expired", after=0.1)
    kwargs = {} if timeout is None else {"timeout_seconds": timeout}
    with pytest.raises(ApiException) as err:
        list(watch.Watch().stream(core.list_namespaced_pod, ns, resource_version=rv, **kwargs))
    assert err.value.status == 410 and err.value.reason.startswith("Expired: too old")
    # kubernetes 36's Watch re-watches once after a 410, unless timeout_seconds was given.
    assert len(sim.requests(verb="watch", namespace=ns)) == watches


def test_request_log_counts_a_clients_calls(sim: kubesim.fixture.Sim, core: client.CoreV1Api,
                                            ns: str) -> None:
    core.create_namespaced_pod(ns, seeded_pod("p"))
    core.read_namespaced_pod("p", ns)
    core.read_namespaced_pod("p", ns)
    gets = sim.requests(verb="get", namespace=ns, resource="pods", name="p")
    assert len(gets) == 2 and all(r["code"] == 200 for r in gets)
    assert len(sim.requests(verb="create", namespace=ns)) == 1


@pytest.mark.parametrize(("rule", "message"), [
    ({"verb": "list", "colour": "red", "status": 500}, "unknown field(s) ['colour']"),
    ({"verb": "list"}, "give status (an error code), delay (seconds) or watch"),
    ({"watch": "explode"}, "watch must be one of"),
])
def test_bad_fault_rule_is_refused_with_the_field_named(sim: kubesim.fixture.Sim,
                                                        rule: dict[str, Any],
                                                        message: str) -> None:
    with pytest.raises(kubesim.fixture.ControlError) as err:
        sim.faults.add(**rule)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_outage_refuses_connections_until_the_api_returns(sim: kubesim.fixture.Sim,
                                                          core: client.CoreV1Api,
                                                          ns: str) -> None:
    core.list_namespaced_pod(ns)  # a pooled keep-alive connection: the outage must cut it
    sim.outage(1.0)
    with pytest.raises(urllib3.exceptions.MaxRetryError) as err:
        core.list_namespaced_pod(ns, _request_timeout=0.5)
    assert "Connection refused" in str(err.value)
    _wait_until_the_api_is_back(core, ns)


def test_the_port_is_closed_by_the_time_the_outage_call_answers(sim: kubesim.fixture.Sim,
                                                                core: client.CoreV1Api,
                                                                ns: str) -> None:
    # Straight after the answer, with no grace: a client told of the outage must not get in.
    host, port = sim.url.removeprefix("http://").rsplit(":", 1)
    request = urllib.request.Request(f"{sim.url}/_kubesim/outage", method="POST",
                                     data=json.dumps({"seconds": 1.0}).encode())
    with urllib.request.urlopen(request, timeout=10) as response:
        assert json.loads(response.read()) == {"outage_seconds": 1.0}
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=2).close()
    _wait_until_the_api_is_back(core, ns)


def test_label_selector_rule_fails_only_requests_for_matching_objects(
        sim: kubesim.fixture.Sim, core: client.CoreV1Api, ns: str) -> None:
    sim.faults.add(namespace=ns, label_selector="team=ml", status=500)
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(ns, seeded_pod("a", labels={"team": "ml"}))
    assert err.value.status == 500
    core.create_namespaced_pod(ns, seeded_pod("b", labels={"team": "web"}))
    core.patch_namespaced_pod("b", ns, {"metadata": {"labels": {"team": "ml"}}})
    with pytest.raises(ApiException):
        core.read_namespaced_pod("b", ns)


async def _async_watch(kubeconfig: str, ns: str) -> list[str]:
    api = await aconfig.new_client_from_config(config_file=kubeconfig)
    async with api:
        core = aclient.CoreV1Api(api)
        seen: list[str] = []
        async with awatch.Watch().stream(core.list_namespaced_pod, ns,
                                         timeout_seconds=5) as events:
            async for event in events:
                seen.append(event["type"])
        return seen


def test_reset_watch_breaks_the_asyncio_clients_stream(sim: kubesim.fixture.Sim,
                                                       core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_pod(ns, seeded_pod("p"))
    sim.faults.add(verb="watch", resource="pods", namespace=ns, watch="reset", after=0.3)
    with pytest.raises(aiohttp.ClientPayloadError):
        asyncio.run(_async_watch(str(sim.kubeconfig), ns))


def test_probabilistic_rule_is_repeatable_with_its_seed(sim: kubesim.fixture.Sim,
                                                        core: client.CoreV1Api, ns: str) -> None:
    def pattern() -> list[bool]:
        sim.faults.clear()
        sim.faults.add(verb="list", resource="pods", namespace=ns, status=503,
                       probability=0.5, seed=7)
        failed = []
        for _ in range(20):
            try:
                core.list_namespaced_pod(ns)
                failed.append(False)
            except ApiException:
                failed.append(True)
        return failed

    first = pattern()
    assert 0 < sum(first) < 20
    assert pattern() == first


def _wait_until_the_api_is_back(core: client.CoreV1Api, ns: str) -> None:
    """Wait until the outage is over and the namespace lists (empty) again, for at most 5 s."""
    def listed() -> bool:
        try:
            return core.list_namespaced_pod(ns).items == []
        except urllib3.exceptions.MaxRetryError:
            return False
    wait_for(listed, 5, "the API to come back")
