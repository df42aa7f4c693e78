"""Why the process that supervises an attempt is stopping it: the reason its notice gives the training.

A backend meets its own process being stopped as an exception in the thread that waits on the
training (Ctrl-C's KeyboardInterrupt, Prefect's TerminationSignal for a SIGTERM). Only the shell can
tell a person's cancel in the Prefect UI from any other SIGTERM (it asks the Prefect API), so it
teaches this module with `learn`; the core stays free of Prefect. With no answer, the backend gives
no notice of its own and the entrypoint's ("terminated") stands.
"""

from __future__ import annotations

from collections.abc import Callable

Resolver = Callable[[BaseException], "str | None"]

_resolvers: list[Resolver] = []


def learn(resolver: Resolver) -> None:
    """Ask ``resolver`` first from now on (once, however often it is learnt)."""
    if resolver not in _resolvers:
        _resolvers.insert(0, resolver)


def reason(exc: BaseException) -> str | None:
    """The notice reason for a stop that reached the supervisor as ``exc``: what a resolver says
    (``cancelled`` for a person's cancel), ``interrupted`` for Ctrl-C, else None. Never raises."""
    for resolver in list(_resolvers):
        try:
            why = resolver(exc)
        except Exception:  # noqa: BLE001 - a stop must go on whatever a resolver meets
            continue
        if why:
            return why
    return "interrupted" if isinstance(exc, KeyboardInterrupt) else None
