"""A server without strict json_schema output: the failure says which setting fixes it,
`AI_RESPONSE_FORMAT=json_object` (JSON mode, the schema in the prompt, every answer still
validated) makes it work, and `san-ai-check` says all of this before a worker runs a job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from san_ai_worker.ai import build_provider
from san_common.errors import PermanentJobError, TransientJobError
from tests.fakes.fake_ai import FakeAiServer


@pytest.fixture
def ai() -> Iterator[FakeAiServer]:
    with FakeAiServer() as server:
        yield server


def _provider(ai: FakeAiServer, response_format: str) -> Any:
    return build_provider(
        "openai",
        base_url=ai.base_url,
        api_key="sk-test",
        chat_model="chat-model",
        embedding_model="embedding-model",
        timeout_seconds=2,
        response_format=response_format,  # type: ignore[arg-type]
    )


async def test_a_server_without_json_schema_fails_naming_the_setting(ai: FakeAiServer) -> None:
    ai.json_schema_supported = False
    provider = _provider(ai, "json_schema")
    try:
        with pytest.raises(PermanentJobError, match="set AI_RESPONSE_FORMAT=json_object"):
            await provider.analyze_card("Asyncio notes\nGather runs coroutines.")
    finally:
        await provider.aclose()


async def test_json_mode_sends_the_schema_in_the_prompt_and_validates_the_answer(
    ai: FakeAiServer,
) -> None:
    ai.json_schema_supported = False
    provider = _provider(ai, "json_object")
    try:
        card = await provider.analyze_card("Asyncio notes\nGather runs coroutines.")
        assert card.title == "Asyncio notes"
        _, body = ai.requests[-1]
        assert body["response_format"] == {"type": "json_object"}
        system = body["messages"][0]["content"]
        schema = json.loads(system.split("matching this JSON schema: ", 1)[1])
        assert set(schema["required"]) >= {"title", "summary", "tags", "category"}

        ai.set_fault("missing_field", times=1)  # JSON, but not the schema's
        with pytest.raises(TransientJobError, match="misses field"):
            await provider.analyze_card("Asyncio notes\nGather runs coroutines.")
    finally:
        await provider.aclose()


def _ai_check(ai: FakeAiServer, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("AI_")}
    return subprocess.run(
        [str(Path(sys.executable).with_name("san-ai-check"))],
        env={
            **base,
            "AI_PROVIDER": "openai",
            "AI_BASE_URL": ai.base_url,
            "AI_API_KEY": "sk-test",
            "AI_TIMEOUT_SECONDS": "5",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_san_ai_check_passes_a_capable_server(ai: FakeAiServer, tmp_path: Path) -> None:
    result = _ai_check(ai, DATA_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "ai: chat ok (json_schema" in result.stdout
    assert "ai: embeddings ok" in result.stdout and "1536 dimensions" in result.stdout


def test_san_ai_check_names_the_fix_for_each_missing_capability(
    ai: FakeAiServer, tmp_path: Path
) -> None:
    ai.json_schema_supported = False
    ai.embedding_dimensions = 768  # a typical local embedding model
    result = _ai_check(ai, DATA_DIR=str(tmp_path))
    assert result.returncode == 1
    chat, embeddings = result.stderr.splitlines()
    assert chat.startswith("ai: chat FAILED") and "AI_RESPONSE_FORMAT=json_object" in chat
    assert embeddings.startswith("ai: embeddings FAILED") and "768 dimensions" in embeddings
    assert "sk-test" not in result.stderr

    fixed = _ai_check(ai, DATA_DIR=str(tmp_path), AI_RESPONSE_FORMAT="json_object")
    assert "ai: chat ok (json_object" in fixed.stdout, fixed.stderr
