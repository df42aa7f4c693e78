"""Scheduling the next attempt through a faulty API still makes exactly one run per key.

The call goes through the fault-injecting proxy to the PostgreSQL-backed server. Prefect's own client
retries 502/503 and dropped connections; a 500 it does not retry, so trainguard repeats the whole call
with the same idempotency key, which must never make a second run, even when the server acted on the
first request and only its answer was lost or turned into a 500.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import httpx
import pytest
from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterIdempotencyKey
from prefect.exceptions import ObjectNotFound
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.scheduling import is_transient_api_error, schedule_run
from services.faulty_proxy import FaultPlan, faulty_proxy


def status_error(code: int) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://127.0.0.1/api/deployments/x/create_flow_run")
    return httpx.HTTPStatusError(f"{code}", request=request, response=httpx.Response(code, request=request))


@pytest.mark.parametrize(("error", "transient"), [
    (status_error(500), True),
    (status_error(502), True),
    (status_error(503), True),
    (status_error(429), True),
    (status_error(408), True),
    (status_error(400), False),
    (status_error(403), False),
    (status_error(404), False),
    (status_error(409), False),
    (status_error(422), False),
    (httpx.ConnectError("refused"), True),
    (httpx.ReadTimeout("slow"), True),
    (httpx.RemoteProtocolError("Server disconnected without sending a response."), True),
    (ValueError("bad parameters"), False),
])
def test_only_server_side_and_connection_errors_count_as_transient(error, transient):
    assert is_transient_api_error(error) is transient


def test_a_500_a_500_after_the_server_acted_and_a_lost_answer_still_make_one_run(pg_server, attempt_deployment):
    plan = FaultPlan(error_rate=0, drop_rate=0, create_fault_rate=0,
                     first_creates=("server-error", "late-error", "lost-answer"))
    key = f"next-attempt-of-{uuid.uuid4()}"
    later = datetime.now(timezone.utc) + timedelta(days=1)  # far enough that no worker picks it up
    with faulty_proxy(pg_server.api_url.removesuffix("/api"), plan) as proxy:
        with temporary_settings({PREFECT_API_URL: f"{proxy}/api"}):
            made = schedule_run(attempt_deployment, idempotency_key=key, scheduled_time=later,
                                parameters={"spec": {"name": "x", "command": ["true"]}}, sleep=lambda s: None)

    assert (plan.counts["server-error"], plan.counts["late-error"], plan.counts["lost-answer"]) == (1, 1, 1)
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(idempotency_key=FlowRunFilterIdempotencyKey(any_=[key])))
        assert [r.id for r in runs] == [made.id]
        client.delete_flow_run(made.id)


def test_a_deployment_that_does_not_exist_is_reported_at_once_not_retried(pg_server):
    plan = FaultPlan(error_rate=0, drop_rate=0, create_fault_rate=0)
    with faulty_proxy(pg_server.api_url.removesuffix("/api"), plan) as proxy:
        with temporary_settings({PREFECT_API_URL: f"{proxy}/api"}):
            with pytest.raises(ObjectNotFound):  # a 404: waiting would only hide the mistake
                schedule_run(uuid.uuid4(), idempotency_key="next-attempt-of-nothing", sleep=pytest.fail)
    assert plan.counts["forwarded"] == 1 and plan.counts["create"] == 0
