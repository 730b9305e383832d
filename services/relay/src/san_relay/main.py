"""`san-relay`: the outbox relay process. Several may run at once.

Publishes committed outbox rows to RabbitMQ with publisher confirms. Configured by the
environment (DATABASE_URL, AMQP_URL, RELAY_*; see docs/operations.md). Exits 1 with one
line when PostgreSQL or RabbitMQ cannot be reached at start-up."""

from __future__ import annotations

from collections.abc import Sequence

from san_common import cli, probes
from san_common.broker.topology import Topology
from san_common.db.engine import create_session_factory
from san_common.dependencies import require_broker, require_database
from san_common.probes import Readiness
from san_common.process import serve
from san_common.settings import load_settings
from san_relay.relay import Relay
from san_relay.settings import RelaySettings

PROG = "san-relay"


async def amain(settings: RelaySettings) -> None:
    engine = settings.database_engine()
    try:
        await require_database(PROG, engine, settings.database_url)
        await require_broker(PROG, settings.amqp_url)
        relay = Relay(settings, create_session_factory(engine), Topology(settings.amqp_prefix))
        ready = Readiness(
            {
                "database": probes.database(engine),
                "broker": probes.flag(relay.broker_connected, "no open channel"),
            }
        )
        await serve(settings, relay.run, ready)
    finally:
        await engine.dispose()


def main(argv: Sequence[str] | None = None) -> None:
    cli.parse(PROG, __doc__ or "", distribution="san-relay", argv=argv)
    cli.run(PROG, amain(load_settings(RelaySettings)))


if __name__ == "__main__":
    main()
