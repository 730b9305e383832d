"""The worker runtime: an AMQP consumer feeding an executor, with middleware around each
job. See consumer.py (AMQP, the process-wide limit), executor.py (one try of a job),
store.py (its transactions), middleware.py (tracing, log context, metrics) and
san_common/retry.py (the retry decision)."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common import deployment, metrics
from san_common.broker.topology import Topology
from san_common.db.engine import bound_engine, plain_url
from san_common.jobs import registry
from san_common.worker import pauses
from san_common.worker.cancels import CancelListener
from san_common.worker.consumer import Consumer
from san_common.worker.executor import Executor, Gate, Middleware, RuntimeConfig
from san_common.worker.handler import JobHandler
from san_common.worker.middleware import DEFAULT_MIDDLEWARE
from san_common.worker.presence import Presence
from san_common.worker.store import JobStore, SqlJobStore


class WorkerRuntime:
    def __init__(
        self,
        *,
        session_factory: async_sessionmaker[AsyncSession],
        amqp_url: str,
        topology: Topology,
        handlers: Mapping[str, JobHandler[Any, Any]],
        config: RuntimeConfig | None = None,
        worker_id: str | None = None,
        middleware: Sequence[Middleware] = DEFAULT_MIDDLEWARE,
        store: JobStore | None = None,
        gate: Gate | None = None,
    ) -> None:
        config = config or RuntimeConfig()
        for job_type in handlers:
            registry.spec_for(job_type)  # every job type served must be registered
        self._sessions = session_factory
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.executor = Executor(
            store=store or SqlJobStore(session_factory),
            handlers=handlers,
            config=config,
            worker_id=self.worker_id,
            middleware=middleware,
            gate=gate,
        )
        self.consumer = Consumer(
            amqp_url=amqp_url,
            topology=topology,
            job_types=[str(t) for t in handlers],
            prefetch=config.prefetch,
            drain_seconds=config.drain_seconds,
            handle=self.executor.handle,
            heartbeat_seconds=config.amqp_heartbeat_seconds,
            paused=pauses.reader(session_factory),
            pause_poll_seconds=config.pause_poll_seconds,
        )
        self.connected = self.consumer.connected
        # Readiness hook (deploy's probes): the consumer is open and consuming.
        self.consuming = self.consumer.consuming
        self.presence = Presence(
            session_factory,
            worker_id=self.worker_id,
            job_types=[str(t) for t in handlers],
            interval=config.heartbeat_seconds,
        )
        url = bound_engine(session_factory).url.render_as_string(hide_password=False)
        self.cancels = CancelListener(
            plain_url(url),
            self.executor.cancel_running,
            timeout_seconds=max(2.0, config.heartbeat_seconds),
        )
        metrics.init_worker_series(str(t) for t in handlers)

    async def run(self, stop: asyncio.Event) -> None:
        self.executor.deployment_id = await deployment.identity(self._sessions)
        present = asyncio.Event()  # listed while it consumes or drains
        beating = asyncio.create_task(self.presence.run(present))
        listening = asyncio.create_task(self.cancels.run(present))
        try:
            await self.consumer.run(
                stop, worker_id=self.worker_id, deployment_id=self.executor.deployment_id
            )
        finally:
            present.set()
            await beating
            await listening
