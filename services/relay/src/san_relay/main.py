"""`san-relay`: the outbox relay process. Several may run at once."""

from __future__ import annotations

import asyncio

from san_common.broker.topology import Topology
from san_common.db.engine import create_engine, create_session_factory
from san_common.process import readiness, serve
from san_common.settings import load_settings
from san_relay.relay import Relay
from san_relay.settings import RelaySettings


async def amain(settings: RelaySettings) -> None:
    engine = create_engine(settings.database_url, pool_size=4)
    try:
        relay = Relay(settings, create_session_factory(engine), Topology(settings.amqp_prefix))
        await serve(settings, relay.run, readiness(engine, settings.amqp_url))
    finally:
        await engine.dispose()


def main() -> None:
    asyncio.run(amain(load_settings(RelaySettings)))


if __name__ == "__main__":
    main()
