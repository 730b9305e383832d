"""The outbox relay: committed outbox rows → RabbitMQ, at least once.

One round: lock a batch (`FOR UPDATE SKIP LOCKED`), publish every message of it with
publisher confirms *in flight together*, mark the confirmed ones published, commit.
A crash after the broker confirmed but before the commit leaves the rows unpublished, so
they are published again: consumers are idempotent by job claim, never by luck.

Under fair share, each job queue's ready messages are kept within a window, the rest
admitted in a fair order; one user's backlog that holds nobody back goes into the queue's
bulk lane instead (docs/architecture.md, "Fair share and priorities").

Only rows that are due are published (`available_at <= now()`): retries and delayed
redeliveries are rows scheduled for later, and so is a row the API publishes itself,
until its grace has passed (docs/architecture.md, "Direct publish"). The relay sleeps on
LISTEN `san_outbox` (a trigger NOTIFYs on an insert of due rows, delivered at commit),
until the next scheduled row is due, or
`relay_poll_seconds` in case a notification is missed — whichever comes first. A lost
listener connection wakes the relay, which listens again; a failed round (database or
broker away) is retried with backoff (`ROUND_BACKOFF`) — the relay never gives up on its
own. A PostgreSQL outage is logged once when it starts and once when it ends
(`san_common.outages`). The relay only publishes: lease rescue, the stranded-message check
and outbox cleanup are the maintenance service's (docs/architecture.md, "Maintenance").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime

import asyncpg
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractExchange,
    AbstractRobustConnection,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from san_common import deployment, metrics
from san_common.broker.connect import connect_robust
from san_common.broker.depths import read_depth
from san_common.broker.monitor import connection_is_open
from san_common.broker.ownership import hold_prefix
from san_common.broker.topology import (
    Topology,
    adopt_legacy_dead_letters,
    bulk_routing_key,
    declare_topology,
)
from san_common.cli import describe
from san_common.db.engine import bound_engine, plain_url
from san_common.errors import is_connection_loss
from san_common.jobs.publishing import publish_row
from san_common.outages import BROKER, DATABASE
from san_common.retry import ROUND_BACKOFF, Retry
from san_relay import repository
from san_relay.repository import Batch, Pending
from san_relay.settings import RelaySettings
from san_relay.window import Windows

log = logging.getLogger(__name__)

NOTIFY_CHANNEL = "san_outbox"


class RoundFailed(Exception):
    """A round whose batch the broker confirmed none of: retried with backoff."""


class Relay:
    def __init__(
        self,
        settings: RelaySettings,
        session_factory: async_sessionmaker[AsyncSession],
        topology: Topology,
    ) -> None:
        self._settings = settings
        self._sessions = session_factory
        # the rounds run on plain connections: they use no ORM, and a session is a layer of
        # greenlet switches and state on every call of the relay's hottest loop
        self._engine = bound_engine(session_factory)
        # when the earliest row scheduled for later becomes due (monotonic), as of the last
        # claim; a row scheduled after it is inserted with a NOTIFY, which wakes the relay
        self._next_due: float | None = None
        # when (monotonic) the latest round that published something began
        self._last_published_round: float | None = None
        self._topology = topology
        self._wakeup = asyncio.Event()
        self._exchanges: dict[str, AbstractExchange] = {}
        self._listener: asyncpg.Connection | None = None
        self._listening = asyncio.Lock()
        self._backlog = asyncio.Event()  # a round found a full batch: the others join in
        self.ready = asyncio.Event()
        self._connection: AbstractRobustConnection | None = None
        self._channel: AbstractChannel | None = None
        # read from the database once (at start, or by the first round); every message
        # carries it
        self._deployment_id: str | None = None
        self._windows = (
            Windows(
                topology,
                least=settings.relay_window_min,
                per_consumer=settings.relay_window_per_consumer,
                seconds=settings.relay_window_seconds,
                poll_seconds=settings.relay_window_poll_seconds,
            )
            if settings.relay_fair_share
            else None
        )
        self._admitting = asyncio.Lock()  # one round at a time measures the windows
        self._lanes_ready = False  # the bulk lanes' rows exist (made by the first use)
        # rows were added (a NOTIFY) or fell due since the last claim: worth a claim even
        # while the windows are full (they may be for another queue)
        self._news = True

    def broker_connected(self) -> bool:
        """Readiness: the publishing connection and channel are open (no new connection)."""
        return (
            connection_is_open(self._connection)
            and self._channel is not None
            and not self._channel.is_closed
        )

    async def run(self, stop: asyncio.Event) -> None:
        self._deployment_id = await deployment.identity(self._sessions)
        connection = await connect_robust(self._settings.amqp_url)
        try:
            # before anything is published: never onto another deployment's queues
            await hold_prefix(connection, self._topology, self._deployment_id)
        except BaseException:
            await connection.close()
            raise
        await self._ensure_listener()
        observer = asyncio.create_task(self._observe_periodically(stop, connection))
        rounds: list[asyncio.Task[None]] = []
        try:
            channel = await self.open_channel(connection)
            if moved := await adopt_legacy_dead_letters(connection, self._topology):
                log.info(
                    "dead letters moved from the earlier quorum dead-letter queue",
                    extra={"fields": {"moved": moved, "to": self._topology.dead_letter_queue}},
                )
            self._connection, self._channel = connection, channel
            self.ready.set()
            log.info("relay running")
            # Under a backlog, rounds overlap: while one waits for its batch's confirms, the
            # next claims and publishes its own (SKIP LOCKED keeps the batches disjoint), so
            # the broker is never idle during a round's claim, mark and commit. Only the
            # first round wakes on NOTIFY; the others join it when it finds a full batch,
            # so a lone message is not raced for by every round.
            rounds = [
                asyncio.create_task(self._publish_rounds(stop, channel, leader=n == 0))
                for n in range(self._settings.relay_rounds_in_flight)
            ]
            await asyncio.gather(*rounds)
        finally:
            for task in (*rounds, observer):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if self._listener is not None:
                await self._listener.close()
            await connection.close()
            log.info("relay stopped")

    async def _publish_rounds(
        self, stop: asyncio.Event, channel: AbstractChannel, *, leader: bool
    ) -> None:
        failures = 0
        while not stop.is_set():
            try:
                await self._ensure_listener()
                started = time.monotonic()
                published = await self.publish_once(channel)
            except Exception as exc:  # the database or broker is away: retry, never die
                failures += 1
                if isinstance(exc, TimeoutError):  # PostgreSQL went silent (engine timeouts)
                    self._forget_listener()
                decision = ROUND_BACKOFF.decide(exc, failures)
                delay = decision.after if isinstance(decision, Retry) else 0.5
                if not isinstance(exc, RoundFailed) and is_connection_loss(exc):
                    DATABASE.lost(exc, "relay round")
                else:
                    # One line per failed round, however big the batch (the traceback at
                    # DEBUG): a broker outage is a handful of lines, not one per message.
                    log.warning(
                        "relay round failed; retrying",
                        extra={
                            "fields": {
                                "retry_in_s": round(delay, 2),
                                "failed_rounds": failures,
                                "error": describe(exc),
                            }
                        },
                    )
                log.debug("relay round failure", exc_info=True)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                continue
            failures = 0
            DATABASE.answered(started)
            if published:
                self._last_published_round = started
            if published >= self._settings.relay_batch_size:
                self._backlog.set()  # more where this came from: the other rounds join
            elif leader:
                await self._sleep(stop)
            else:
                await self._wait_for_backlog(stop)

    async def open_channel(self, connection: AbstractConnection) -> AbstractChannel:
        """The publishing channel: publisher confirms (a row is marked published only once
        the broker has the message) and mandatory returns raised (unroutable = unconfirmed)."""
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        await declare_topology(channel, self._topology)
        return channel

    async def publish_once(self, channel: AbstractChannel) -> int:
        """Publish one batch; returns how many rows were confirmed and marked."""
        if self._deployment_id is None:
            self._deployment_id = await deployment.identity(self._sessions)
        async with self._engine.begin() as connection:
            batch = await self._claim(connection)
            if batch is None:  # every window is (nearly) full: nothing claimed
                return 0
            self._next_due = (
                None
                if batch.next_due_seconds is None
                else time.monotonic() + batch.next_due_seconds
            )
            rows = batch.rows
            if not rows:
                return 0
            if self._windows is None or batch.bulk:
                confirmed, first_error = await self._publish(channel, rows, bulk=batch.bulk)
            else:
                taken = self._windows.reserve(r.routing_key for r in rows)
                confirmed = []
                try:
                    confirmed, first_error = await self._publish(channel, rows)
                finally:
                    self._windows.settle(taken, self._confirmed_per_queue(rows, confirmed))
            if not confirmed:  # nothing got through: a failed round, so the loop backs off
                metrics.OUTBOX_PUBLISH_FAILURES.inc(len(rows))
                raise RoundFailed(f"broker confirmed none of {len(rows)} messages: {first_error}")
            await repository.mark_published(connection, confirmed)
        metrics.OUTBOX_PUBLISHED.inc(len(confirmed))
        confirmed_at, confirmed_ids = datetime.now(UTC), set(confirmed)
        for row in rows:
            if row.id in confirmed_ids:
                lag = (confirmed_at - row.created_at).total_seconds()
                metrics.OUTBOX_PUBLISH_LAG.observe(max(0.0, lag))
        if len(confirmed) < len(rows):
            metrics.OUTBOX_PUBLISH_FAILURES.inc(len(rows) - len(confirmed))
            log.warning(
                "broker did not confirm every message; they stay in the outbox",
                extra={
                    "fields": {
                        "confirmed": len(confirmed),
                        "batch": len(rows),
                        "error": first_error,
                    }
                },
            )
        return len(confirmed)

    async def _claim(self, connection: AsyncConnection) -> Batch | None:
        """The round's rows; None when the windows leave no room worth a claim.

        Without a held-back backlog the claim is the plain one, as cheap as before fair
        share: whatever order it takes the due rows in, a batch that fits in its queues'
        windows keeps every queue's ready messages within its window. Only when it does
        not fit — or the last fair claim left rows behind — does the round claim in
        admission order (`claim_outbox_fair`), the rooms as measured now."""
        size = self._settings.relay_batch_size
        windows = self._windows
        if windows is None:
            return await repository.claim_unpublished(connection, size)
        async with self._admitting:  # between measuring and reserving, one round at a time
            if not windows.holding:
                batch = await repository.claim_unpublished(connection, size)
                over = windows.fits(r.routing_key for r in batch.rows)
                if over and (stale := windows.stale(over)):
                    await windows.read(self._broker(), stale)
                    over = windows.fits(r.routing_key for r in batch.rows)
                if not over:
                    return batch
                if (bulk := await self._into_bulk(connection, batch)) is not None:
                    return bulk
                # The plain batch's rows stay locked until the commit; the fair claim
                # re-takes those it chooses (a transaction's own locks are not skipped).
            # Only queues with messages in them can have more room than counted.
            if stale := windows.stale(windows.occupied()):
                await windows.read(self._broker(), stale)
            # Without new rows, a claim is worth it only once the consumers made room.
            news, self._news = self._news, False
            if windows.holding and not news and not windows.wants_refill():
                return None
            keys, key_queue, rooms = windows.claim_arguments()
            batch = await repository.claim_fair(
                connection,
                size,
                keys=keys,
                key_queue=key_queue,
                rooms=rooms,
                aging_seconds=self._settings.relay_batch_aging_seconds,
            )
            windows.hold(batch.held)
            return batch

    async def _into_bulk(self, connection: AsyncConnection, batch: Batch) -> Batch | None:
        """`batch` bound for its queue's bulk lane, when it may go there; else None.

        A batch that overfills its window is often one user's backlog (a burst of
        scraps, a drain after an outage). Nobody else's work waits behind it if it goes
        into the bulk lane: the workers consume the lane beside the queue, with a
        consumer of its own. So it may, when the batch is one user's, of one class and one
        queue, nobody else has work due for the queue, and the lane holds no one else's
        messages: its owner (a row every relay locks for this) is the user, or it is read
        empty now. Otherwise the backlog waits in the outbox for the fair claim as before.
        The backlog then costs no admission rounds, which a drain of millisecond jobs
        felt (docs/architecture.md, "Fair share and priorities")."""
        assert self._windows is not None
        queues = {self._windows.queue_of(r.routing_key) for r in batch.rows}
        if len(queues) != 1 or None in queues:
            return None
        queue = queues.pop()
        assert queue is not None
        if not self._lanes_ready:  # committed at once: the other rounds must see the rows
            async with self._engine.begin() as own:
                await repository.ensure_lanes(own, self._windows.names())
            self._lanes_ready = True
        keys = self._windows.keys_of(queue)
        sole = await repository.sole_user(
            connection, [r.id for r in batch.rows], keys=keys, queue=queue
        )
        if sole is None:
            return None
        if sole.lane_owner != sole.user_id:
            lane = self._topology.bulk_queue_name(keys[0])
            if await self._windows.ready_in(self._broker(), lane) > 0:
                return None
            await repository.take_lane(connection, queue, sole.user_id)
        return replace(batch, bulk=True)

    def _broker(self) -> AbstractConnection:
        if self._connection is None:
            raise RoundFailed("no broker connection to measure the queues with")
        return self._connection

    def _confirmed_per_queue(
        self, rows: Sequence[Pending], confirmed: Sequence[int]
    ) -> Counter[str]:
        assert self._windows is not None
        ids = set(confirmed)
        return Counter(
            q
            for r in rows
            if r.id in ids and (q := self._windows.queue_of(r.routing_key)) is not None
        )

    async def _publish(
        self, channel: AbstractChannel, rows: Sequence[Pending], *, bulk: bool = False
    ) -> tuple[list[int], str | None]:
        """The ids the broker confirmed, and the first failure's description (the round's
        one warning names it; a line per message would flood the log in an outage)."""

        timeout = self._settings.relay_publish_timeout_seconds
        assert self._deployment_id is not None  # read by publish_once
        deployment_id = self._deployment_id

        async def publish(row: Pending) -> int:
            exchange = await self._exchange(channel, row.exchange)
            return await publish_row(
                exchange,
                row,
                deployment_id=deployment_id,
                confirm_seconds=timeout,
                routing_key=bulk_routing_key(row.routing_key) if bulk else None,
            )

        # All confirms in flight at once: awaiting them one by one caps the relay at one
        # broker round trip per message (benchmarks/results/platform.md).
        results = await asyncio.gather(*(publish(r) for r in rows), return_exceptions=True)
        confirmed = [r for r in results if isinstance(r, int)]
        failures = [r for r in results if isinstance(r, BaseException)]
        return confirmed, describe(failures[0]) if failures else None

    async def _exchange(self, channel: AbstractChannel, logical_name: str) -> AbstractExchange:
        """A logical exchange, checked to exist once."""
        name = self._topology.exchange_for(logical_name)
        exchange = self._exchanges.get(name)
        if exchange is None:
            exchange = self._exchanges[name] = await channel.get_exchange(name, ensure=True)
        return exchange

    async def _ensure_listener(self) -> None:
        if self._listener is not None and not self._listener.is_closed():
            return
        async with self._listening:  # the rounds in flight share one listener
            await self._listen_again()

    async def _listen_again(self) -> None:
        if self._listener is not None and not self._listener.is_closed():
            return  # another round listened again while this one waited
        lost = self._listener is not None
        timeout = self._settings.relay_database_timeout_seconds
        connection = await asyncpg.connect(
            plain_url(self._settings.database_url), timeout=timeout, command_timeout=timeout
        )
        if lost:  # an outage's own lost connection is the outage's line, not another one
            log.log(
                logging.INFO if DATABASE.ongoing else logging.WARNING,
                "LISTEN connection lost; listening again",
            )
        await connection.add_listener(NOTIFY_CHANNEL, lambda *_: self._notified())
        # Waking on the loss makes the next round listen again (and catch up by polling).
        connection.add_termination_listener(lambda *_: self._wakeup.set())
        self._listener = connection

    def _notified(self) -> None:
        self._news = True
        self._wakeup.set()

    def _forget_listener(self) -> None:
        """The round's connection stopped answering: the listener's very likely went silent
        with it, and a partition that sends no reset would leave it open and deaf for good
        (the relay down to polling). The next round listens again on a new connection."""
        if self._listener is not None and not self._listener.is_closed():
            self._listener.terminate()

    async def _wait_for_backlog(self, stop: asyncio.Event) -> None:
        # A full batch found after this clear sets it again; one set before it is lost,
        # which costs at most one round of overlap (the leader sets it every full batch).
        self._backlog.clear()
        await _first_set(self._backlog, stop)

    async def _sleep(self, stop: asyncio.Event) -> None:
        timeout = self._settings.relay_poll_seconds
        if self._windows is not None and self._windows.holding:  # the consumers make room
            timeout = min(timeout, self._settings.relay_window_poll_seconds)
        if self._next_due is not None:  # a row scheduled for later, as the last claim saw
            timeout = min(timeout, max(0.0, self._next_due - time.monotonic()) + 0.01)
            self._news = self._news or self._next_due <= time.monotonic() + timeout
        try:
            await _first_set(self._wakeup, stop, within=timeout)
            # Messages that keep coming one by one (a burst of single registrations) would
            # each get a round of their own: a claim, a publish, a confirm and a commit per
            # message, which took more CPU than the jobs did (docs/hot-paths.md). Within
            # the spacing of the last round that published, the round waits for the rest
            # of it and takes whatever arrived meanwhile. A message after a quiet spell
            # goes out at once.
            if self._last_published_round is not None:
                spacing = self._settings.relay_round_spacing_seconds
                rest = self._last_published_round + spacing - time.monotonic()
                if rest > 0:
                    await _first_set(stop, within=rest)
        finally:
            self._wakeup.clear()

    async def _observe_periodically(
        self, stop: asyncio.Event, connection: AbstractConnection
    ) -> None:
        """Every few seconds: outbox backlog and oldest age, and the queues' depths, so an
        alert sees a stuck relay or a growing queue while it happens."""
        channel: AbstractChannel | None = None
        await self.ready.wait()  # the queues exist once the topology is declared
        while not stop.is_set():
            async with DATABASE.guard("measuring the outbox"):
                await self.observe_outbox()
            began = time.monotonic()
            try:
                if channel is None or channel.is_closed:
                    channel = await connection.channel()
                await self.observe_queues(channel)
            except Exception as exc:  # measuring is best effort; the next round retries
                BROKER.lost(exc, "measuring the queues")
            else:
                BROKER.answered(began)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._settings.relay_metrics_interval_seconds)

    async def observe_outbox(self) -> None:
        async with self._sessions() as session:
            backlog, oldest = await repository.backlog(session)
        metrics.OUTBOX_BACKLOG.set(backlog)
        metrics.OUTBOX_OLDEST_AGE.set(oldest)

    async def observe_queues(self, channel: AbstractChannel) -> None:
        for name in self._topology.all_queue_names():
            # passive: a queue that vanished closes this channel, never re-creates the queue
            depth = await read_depth(channel, name)
            metrics.QUEUE_MESSAGES.labels(name).set(depth.ready)


async def _first_set(*events: asyncio.Event, within: float | None = None) -> None:
    """Until one of `events` is set, or `within` seconds pass."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=within, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
