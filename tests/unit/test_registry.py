"""The job-type registry: every entry names a handler that exists and serves that type,
each worker serves exactly its registry entries, and test-only types come and go."""

from __future__ import annotations

import importlib

import pytest

from san_ai_worker.ai.local import LocalProvider
from san_ai_worker.handlers import build_handlers as ai_handlers
from san_common.jobs import registry
from san_common.jobs.types import JobType


@pytest.mark.parametrize("spec", registry.all_specs(), ids=lambda s: str(s.job_type))
def test_each_entry_binds_an_importable_handler_of_its_type(spec: registry.JobSpec) -> None:
    module, _, name = spec.handler.partition(":")
    handler = getattr(importlib.import_module(module), name)
    assert handler.job_type == spec.job_type
    assert spec.queue == str(spec.job_type).lower()


def test_every_built_in_type_is_registered_once_with_its_consumer() -> None:
    assert set(registry.job_types()) == {t.value for t in JobType}
    assert set(registry.job_types(registry.GITHUB_WORKER)) == {JobType.TIL_GITHUB_COMMIT.value}
    assert registry.spec_for(JobType.TIL_GENERATION).user_lock == registry.TIL_USER_LOCK
    assert set(registry.mirrored()) == {
        JobType.TIL_GENERATION.value,
        JobType.RECALL_QUIZ_GENERATION.value,
        JobType.TIL_GITHUB_COMMIT.value,
    }


def test_the_ai_worker_serves_its_entries() -> None:
    served = set(ai_handlers(LocalProvider()))
    # star recommendations need GitHub access, given by `main`
    assert served | {JobType.GITHUB_STAR_RECOMMENDATION.value} == set(
        registry.job_types(registry.AI_WORKER)
    )


def test_a_type_registered_for_a_block_is_gone_after_it() -> None:
    spec = registry.spec_for(JobType.SCRAP_REFINE)
    test_spec = registry.JobSpec(
        job_type="SAN_TEST_UNIT",
        consumer="tests",
        handler="x:y",
        target="none",
        target_exists=spec.target_exists,
        already_done=spec.already_done,
    )
    with registry.registered(test_spec):
        assert registry.spec_for("SAN_TEST_UNIT") is test_spec
        with pytest.raises(ValueError, match="already registered"):
            registry.register(test_spec)
    with pytest.raises(registry.UnknownJobType):
        registry.spec_for("SAN_TEST_UNIT")
