from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from sqlalchemy.ext.asyncio import AsyncEngine

from san_common.db.engine import create_engine
from san_common.settings import ServiceSettings


class RelaySettings(ServiceSettings):
    reported_prefixes: ClassVar[tuple[str, ...]] = ("RELAY_",)
    service_name: str = "relay"
    relay_batch_size: int = Field(default=200, ge=1, le=5000)
    relay_rounds_in_flight: int = Field(
        default=2,
        ge=1,
        le=8,
        description="Rounds at once: one claims and publishes while another awaits confirms",
    )
    relay_poll_seconds: float = Field(
        default=2.0, gt=0, description="Fallback poll interval when no NOTIFY arrives"
    )
    relay_round_spacing_seconds: float = Field(
        default=0.02,
        ge=0,
        le=1,
        description=(
            "While messages keep coming, a round woken by one starts no sooner than this "
            "after the last round that published: the ones arriving meanwhile go out with "
            "it (0: every notification starts a round at once)"
        ),
    )
    relay_fair_share: bool = Field(
        default=True,
        description=(
            "Admit messages into each job queue only up to its window, interactive first "
            "and round-robin by user (false: publish every due row at once, in order)"
        ),
    )
    relay_window_min: int = Field(
        default=10,
        ge=1,
        le=100_000,
        description="A job queue's window when it has no consumers (and at least)",
    )
    relay_window_per_consumer: int = Field(
        default=10,
        ge=1,
        le=100_000,
        description=(
            "Messages ready in a job queue per consumer of it (the workers' WORKER_PREFETCH); "
            "the window is the largest of this × consumers, RELAY_WINDOW_MIN and the "
            "throughput term (RELAY_WINDOW_SECONDS)"
        ),
    )
    relay_window_seconds: float = Field(
        default=0.2,
        ge=0,
        le=60,
        description=(
            "The window holds at least what a job queue's consumers took in this many "
            "seconds: about how long a message waits behind others' (0: no such term)"
        ),
    )
    relay_window_poll_seconds: float = Field(
        default=0.02,
        gt=0,
        le=5,
        description="While a window holds messages back, how often the queues are re-read",
    )
    relay_batch_aging_seconds: float = Field(
        default=300.0,
        ge=0,
        description="A batch-class message due for longer than this is admitted as interactive",
    )
    relay_publish_timeout_seconds: float = Field(default=10.0, gt=0)
    relay_database_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Longest wait on PostgreSQL for a connection, a connect or a statement",
    )
    relay_metrics_interval_seconds: float = Field(
        default=5.0, gt=0, description="How often the outbox backlog and queue depths are measured"
    )

    def database_engine(self) -> AsyncEngine:
        """One connection per round in flight, one for the observer and a spare. No
        pre-ping: it cost three round trips a round, and a failed round is retried anyway.
        Every wait is bounded, so a relay cut off from PostgreSQL without a reset fails its
        round in time and connects again; the server ends a round's transaction its relay
        left open (a round's transaction also waits for its confirms: that long more)."""
        timeout = self.relay_database_timeout_seconds
        return create_engine(
            self.database_url,
            pool_size=self.relay_rounds_in_flight + 2,
            pre_ping=False,
            timeout_seconds=timeout,
            idle_transaction_seconds=self.relay_publish_timeout_seconds + timeout,
        )
