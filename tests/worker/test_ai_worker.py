"""The ai-worker runtime in-process, fed by the real relay over real RabbitMQ, calling a
fake OpenAI-compatible server on loopback through the real `openai` provider."""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_ai_worker.ai.provider import build_provider
from san_ai_worker.handlers import build_handlers
from san_common import metrics
from san_common.broker.topology import Topology
from san_common.db.engine import create_engine, create_session_factory
from san_common.jobs.registration import register_job
from san_common.jobs.types import JobType
from san_common.models import AsyncJobTry, KnowledgeCard, OutboxMessage, Scrap, Tag, User
from san_common.worker import WorkerRuntime
from tests.fakes.fake_ai import FakeAiServer
from tests.faults.harness import killing_trigger, run_sql
from tests.running import FAST, worker_and_relay
from tests.waiting import eventually, settled_job

pytestmark = pytest.mark.rabbit


@dataclass
class Harness:
    sessions: async_sessionmaker[AsyncSession]
    ai: FakeAiServer
    worker: WorkerRuntime

    async def scrap(self, content: str) -> Scrap:
        async with self.sessions() as session, session.begin():
            user_id = await session.scalar(
                insert(User).values(external_id=f"w-{uuid.uuid4().hex}").returning(User.id)
            )
            scrap = Scrap(
                user_id=user_id,
                content=content,
                content_hash=hashlib.sha256(content.encode()).hexdigest(),
            )
            session.add(scrap)
        return scrap

    async def register(self, job_type: JobType, scrap: Scrap) -> uuid.UUID:
        job = await register_job(
            self.sessions, job_type=job_type, target_id=scrap.id, user_id=scrap.user_id
        )
        return job.job_id

    def chat_requests(self, schema: str, needle: str) -> int:
        return sum(
            1
            for path, body in self.ai.requests
            if path.endswith("/chat/completions")
            and body["response_format"]["json_schema"]["name"] == schema
            and any(needle in m["content"] for m in body["messages"])
        )


@pytest.fixture
async def harness(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fake_ai: FakeAiServer,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Harness]:
    config = getattr(request, "param", FAST)  # a test's own RuntimeConfig (indirect)
    engine = create_engine(fresh_db_url, pool_size=10)
    sessions = create_session_factory(engine)
    provider = build_provider(
        "openai", base_url=fake_ai.base_url, api_key="sk-test-key-123456", timeout_seconds=0.5
    )
    fake_ai.set_fault(None)
    fake_ai.chat_override = None
    try:
        async with worker_and_relay(
            sessions, fresh_db_url, amqp_url, topology, build_handlers(provider), config
        ) as worker:
            yield Harness(sessions, fake_ai, worker)
    finally:
        fake_ai.set_fault(None)
        await provider.aclose()
        await engine.dispose()


async def test_card_analysis_stores_card_with_category_tags_and_embedding(harness: Harness) -> None:
    scrap = await harness.scrap(f"Rust ownership and borrowing rules {uuid.uuid4()}")
    job = await settled_job(harness.sessions, await harness.register(JobType.CARD_ANALYSIS, scrap))
    assert job.status == "COMPLETED", job.error_message
    async with harness.sessions() as session:
        card = await session.scalar(select(KnowledgeCard).where(KnowledgeCard.scrap_id == scrap.id))
        tags = await session.scalar(
            select(func.count()).select_from(Tag).where(Tag.user_id == scrap.user_id)
        )
    assert card is not None and card.title and card.summary
    assert len(card.embedding) == 1536
    assert tags and tags > 0


async def test_scrap_refine_stores_refined_content(harness: Harness) -> None:
    scrap = await harness.scrap(f"messy   text\n\n\n\nwith gaps {uuid.uuid4()}")
    job = await settled_job(harness.sessions, await harness.register(JobType.SCRAP_REFINE, scrap))
    assert job.status == "COMPLETED", job.error_message
    async with harness.sessions() as session:
        refined = await session.scalar(select(Scrap.refined_content).where(Scrap.id == scrap.id))
    assert refined


async def test_message_published_twice_is_processed_once(harness: Harness) -> None:
    marker = uuid.uuid4().hex
    scrap = await harness.scrap(f"Idempotent consumers {marker}")
    skipped_before = metrics.MESSAGES_SKIPPED.labels("CARD_ANALYSIS")._value.get()
    async with harness.sessions() as session, session.begin():
        job = await register_job_in_same_tx_twice(session, scrap)
    finished = await settled_job(harness.sessions, job)
    assert finished.status == "COMPLETED"

    async def second_delivery_skipped() -> bool:
        return metrics.MESSAGES_SKIPPED.labels("CARD_ANALYSIS")._value.get() > skipped_before

    await eventually(second_delivery_skipped, within=20, what="the second delivery skipped")
    assert harness.chat_requests("card_analysis", marker) == 1
    async with harness.sessions() as session:
        cards = await session.scalar(
            select(func.count())
            .select_from(KnowledgeCard)
            .where(KnowledgeCard.scrap_id == scrap.id)
        )
    assert cards == 1


async def register_job_in_same_tx_twice(session: AsyncSession, scrap: Scrap) -> uuid.UUID:
    """Register a job, then add a second outbox row carrying the very same envelope, as a
    relay that crashed between confirm and mark would end up publishing."""
    from san_common.jobs.registration import register_job_in_transaction

    registered = await register_job_in_transaction(
        session, job_type=JobType.CARD_ANALYSIS, target_id=scrap.id, user_id=scrap.user_id
    )
    original = await session.scalar(
        select(OutboxMessage).where(OutboxMessage.message_id == registered.message_id)
    )
    assert original is not None
    await session.execute(
        insert(OutboxMessage).values(
            message_id=uuid.uuid4(),
            exchange=original.exchange,
            routing_key=original.routing_key,
            body=original.body,
            headers=original.headers,
        )
    )
    return registered.job_id


@pytest.mark.parametrize(
    ("fault", "expected", "transient"),
    [
        ("http_500", "500", True),
        ("timeout", "tim", True),
        ("invalid_json", "not valid JSON", True),
        ("missing_field", "field", True),
        ("wrong_dimension", "2048", False),
    ],
)
async def test_ai_faults_fail_the_job_with_a_cause_chain_and_the_worker_goes_on(
    harness: Harness, fault: str, expected: str, transient: bool
) -> None:
    harness.ai.delay_seconds = 2.0
    harness.ai.set_fault(fault)  # type: ignore[arg-type]
    scrap = await harness.scrap(f"Faulty analysis {fault} {uuid.uuid4()}")
    job = await settled_job(harness.sessions, await harness.register(JobType.CARD_ANALYSIS, scrap))
    assert job.status == "FAILED"
    assert job.error_message is not None
    assert expected.lower() in job.error_message.lower(), job.error_message
    assert job.error_message.startswith("CARD_ANALYSIS failed: ")
    # transient faults are retried (max_tries=2) before the job is declared failed
    assert ("gave up after 2 tries" in job.error_message) is transient, job.error_message
    assert "sk-test-key" not in job.error_message
    async with harness.sessions() as session:
        assert (
            await session.scalar(select(KnowledgeCard.id).where(KnowledgeCard.scrap_id == scrap.id))
            is None
        )

    harness.ai.set_fault(None)
    healthy = await harness.scrap(f"After the storm {uuid.uuid4()}")
    job = await settled_job(
        harness.sessions, await harness.register(JobType.CARD_ANALYSIS, healthy)
    )
    assert job.status == "COMPLETED", job.error_message


async def test_transient_failure_is_retried_then_succeeds(harness: Harness) -> None:
    harness.ai.set_fault("http_500", times=1)
    scrap = await harness.scrap(f"Retry me {uuid.uuid4()}")
    job = await settled_job(harness.sessions, await harness.register(JobType.CARD_ANALYSIS, scrap))
    assert job.status == "COMPLETED", job.error_message


async def test_unreadable_message_is_dead_lettered_not_redelivered_forever(
    harness: Harness, amqp_url: str, topology: Topology
) -> None:
    import aio_pika

    connection = await aio_pika.connect(amqp_url)
    channel = await connection.channel()
    exchange = await channel.get_exchange(topology.jobs_exchange)
    await exchange.publish(aio_pika.Message(b"{not json"), routing_key="CARD_ANALYSIS")
    dead = await channel.get_queue(topology.dead_letter_queue)

    async def dead_lettered() -> bool:
        message = await dead.get(fail=False, no_ack=True)
        return message is not None and message.body == b"{not json"

    try:
        await eventually(dead_lettered, within=20, what="the unreadable message dead-lettered")
    finally:
        await connection.close()


# The first two result writes of SCRAP_REFINE terminate their own backend mid-statement:
# the worker's connection dies inside its store.
KILL_TWO_STORES = (
    killing_trigger("kill_store", 2)
    + """
CREATE TRIGGER kill_refine_store BEFORE UPDATE OF refined_content ON scraps
    FOR EACH ROW EXECUTE FUNCTION kill_store();
"""
)


async def test_an_outage_in_the_store_holds_the_result_and_the_job_completes_once(
    harness: Harness, fresh_db_url: str
) -> None:
    """The database connection dies while results are stored (the backend terminated under
    the statement): the worker holds the result and stores it again once it can — the
    same try completes, and the AI is asked once (docs/reliability.md, "Held results")."""
    await run_sql(fresh_db_url, KILL_TWO_STORES)
    marker = uuid.uuid4().hex
    scrap = await harness.scrap(f"survives an outage {marker}")
    job = await settled_job(harness.sessions, await harness.register(JobType.SCRAP_REFINE, scrap))
    assert job.status == "COMPLETED", job.error_message
    refined, killed, outcomes = await _after_the_kills(harness, scrap, job.job_id)
    assert refined
    assert killed == 3, "two stores lost their connection, the third stored"
    assert outcomes == ["completed"]
    assert harness.chat_requests("scrap_refine", marker) == 1


@pytest.mark.parametrize(
    "harness", [dataclasses.replace(FAST, held_results=0)], ids=["no-held-results"], indirect=True
)
async def test_an_outage_in_the_store_with_no_result_held_requeues_and_the_job_completes(
    harness: Harness, fresh_db_url: str
) -> None:
    """With no result held (WORKER_HELD_RESULTS=0, or past the cap), the same outage takes
    the outage path: the message goes back to the queue after a pause, the job is taken
    back, and it completes — once."""
    await run_sql(fresh_db_url, KILL_TWO_STORES)
    marker = uuid.uuid4().hex
    scrap = await harness.scrap(f"survives an outage {marker}")
    job = await settled_job(harness.sessions, await harness.register(JobType.SCRAP_REFINE, scrap))
    assert job.status == "COMPLETED", job.error_message
    refined, killed, outcomes = await _after_the_kills(harness, scrap, job.job_id)
    assert refined
    assert killed == 3, "two stores lost their connection, the third stored"
    # an outage is not the job's fault: the interrupted tries were given back, none spent
    assert outcomes == ["released", "released", "completed"]
    # each delivery called the AI again, but only one result was stored and completed
    assert harness.chat_requests("scrap_refine", marker) == 3


async def _after_the_kills(
    harness: Harness, scrap: Scrap, job_id: uuid.UUID
) -> tuple[str | None, int, list[str | None]]:
    async with harness.sessions() as session:
        refined = await session.scalar(select(Scrap.refined_content).where(Scrap.id == scrap.id))
        killed = await session.scalar(text("SELECT last_value FROM kill_store"))
        outcomes = (
            await session.scalars(
                select(AsyncJobTry.outcome)
                .where(AsyncJobTry.job_id == job_id)
                .order_by(AsyncJobTry.try_no)
            )
        ).all()
    return refined, int(killed or 0), list(outcomes)
