"""Process plumbing shared by the non-HTTP services: signals, probes, logging."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

from san_common.logs import configure_service_logging
from san_common.probes import ProbeServer, ReadinessCheck
from san_common.settings import ServiceSettings
from san_common.tracing import configure_tracing, shutdown_tracing

log = logging.getLogger(__name__)


def stop_on_signals(stop: asyncio.Event) -> None:
    """SIGTERM (Kubernetes, compose) and SIGINT (Ctrl-C) both mean: drain and exit."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


async def serve(
    settings: ServiceSettings,
    work: Callable[[asyncio.Event], Awaitable[None]],
    ready: ReadinessCheck,
) -> None:
    """Run `work(stop)` with probes up, until a signal sets `stop` and `work` returns."""
    configure_service_logging(settings)
    configure_tracing(settings)
    stop = asyncio.Event()
    stop_on_signals(stop)
    probes = ProbeServer(settings.probe_host, settings.probe_port, ready)
    await probes.start()
    try:
        await work(stop)
    finally:
        await probes.stop()
        # flushing exports over HTTP: off the event loop
        await asyncio.to_thread(shutdown_tracing)
