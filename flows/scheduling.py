"""Scheduling an attempt as a deployment run so that it happens exactly once, however the API behaves.

Every call carries an idempotency key, so repeating it after an error cannot make a second run: the
server answers a repeated key with the run it already made. Prefect's client retries 502/503/429,
timeouts and dropped connections by itself; here the whole call is repeated on those once the
client's own retries are spent, and also on other 5xx answers (a server whose database hiccuped
answers 500), which Prefect's client does not retry. 4xx answers are configuration problems and are
raised at once.
"""

from __future__ import annotations

from collections.abc import Callable
import time
from typing import Any

import httpx
from prefect.deployments import run_deployment
from prefect.logging import get_logger

from trainguard.core.retrying import call_with_retries

logger = get_logger("trainguard.scheduling")

RETRIED_STATUS = frozenset({408, 429})


def is_transient_api_error(exc: BaseException) -> bool:
    """Whether a failed Prefect API call may succeed if it is made again."""
    if isinstance(exc, httpx.TransportError):  # refused, reset, timed out: the server may be restarting
        return True
    if isinstance(exc, httpx.HTTPStatusError):
        status = exc.response.status_code
        return status >= 500 or status in RETRIED_STATUS
    return False


def schedule_run(
    deployment_id: Any,
    *,
    idempotency_key: str,
    sleep: Callable[[float], None] | None = None,
    **kwargs: Any,
) -> Any:
    """`run_deployment(deployment_id, idempotency_key=…, timeout=0, as_subflow=False, **kwargs)`, retried.

    Returns the flow run the server made (or had already made for this key).
    """
    def call() -> Any:
        return run_deployment(deployment_id, idempotency_key=idempotency_key, timeout=0, as_subflow=False, **kwargs)

    def note(number: int, exc: BaseException, delay: float) -> None:
        logger.warning("scheduling %s failed (%s: %s); trying again in %.0f s, same key",
                       idempotency_key, type(exc).__name__, str(exc)[:200], delay)

    return call_with_retries(call, is_transient_api_error, on_retry=note, sleep=sleep or time.sleep)


__all__ = ["is_transient_api_error", "schedule_run"]
