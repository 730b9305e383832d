"""The job-type registry: every production type is registered once, each worker's
`@handles` classes are exactly its registry entries, and test-only types come and go."""

from __future__ import annotations

import pytest

from san_ai_worker.ai.local import LocalProvider
from san_ai_worker.handlers import build_handlers as ai_handlers
from san_common.jobs import registry
from san_common.jobs.types import JobType
from san_common.models import Scrap
from san_common.worker import collect
from san_github_worker.handlers import build_handlers as github_handlers

_SCRAPS = registry.spec_for(JobType.SCRAP_REFINE).target


def test_every_production_type_is_registered_once_with_its_consumer() -> None:
    assert set(registry.job_types()) == {t.value for t in JobType}
    assert set(registry.job_types(registry.GITHUB_WORKER)) == {JobType.TIL_GITHUB_COMMIT.value}
    assert registry.spec_for(JobType.TIL_GENERATION).user_lock == registry.TIL_USER_LOCK
    assert set(registry.mirrored()) == {
        JobType.TIL_GENERATION.value,
        JobType.RECALL_QUIZ_GENERATION.value,
        JobType.TIL_GITHUB_COMMIT.value,
    }
    assert registry.spec_for(JobType.CARD_ANALYSIS).target is Scrap.__table__


def test_each_worker_collects_a_handler_for_exactly_its_entries() -> None:
    ai = ai_handlers(LocalProvider(), github=object(), cipher=object())  # type: ignore[arg-type]
    github = github_handlers(object(), object(), object())  # type: ignore[arg-type]
    for served, consumer in ((ai, registry.AI_WORKER), (github, registry.GITHUB_WORKER)):
        assert set(served) == set(registry.job_types(consumer))
        for job_type, handler in served.items():
            assert handler.job_type == job_type


def test_a_handler_left_without_its_resource_is_left_out() -> None:
    served = set(ai_handlers(LocalProvider()))  # no GitHub access
    assert served == set(registry.job_types(registry.AI_WORKER)) - {
        JobType.GITHUB_STAR_RECOMMENDATION.value
    }


def test_a_handler_of_another_workers_type_is_refused() -> None:
    with pytest.raises(ValueError, match="does not consume"):
        collect("tests.unit.registry_misplaced", consumer=registry.AI_WORKER)


def test_a_mirror_of_another_table_is_refused() -> None:
    summaries = registry.spec_for(JobType.TIL_GENERATION).mirror
    with pytest.raises(ValueError, match="mirror must be the target table"):
        registry.JobSpec(
            job_type="SAN_TEST_UNIT",
            consumer="tests",
            target=_SCRAPS,
            already_done=registry.spec_for(JobType.SCRAP_REFINE).already_done,
            mirror=summaries,
        )


def test_a_type_registered_for_a_block_is_gone_after_it() -> None:
    spec = registry.spec_for(JobType.SCRAP_REFINE)
    test_spec = registry.JobSpec(
        job_type="SAN_TEST_UNIT",
        consumer="tests",
        target=spec.target,
        already_done=spec.already_done,
    )
    with registry.registered(test_spec):
        assert registry.spec_for("SAN_TEST_UNIT") is test_spec
        with pytest.raises(ValueError, match="already registered"):
            registry.register(test_spec)
    with pytest.raises(registry.UnknownJobType):
        registry.spec_for("SAN_TEST_UNIT")
