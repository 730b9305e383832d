"""`san-ai-check` (`make ai-check`): does the configured AI server do what SAN needs?

One structured chat call (a card analysis, with AI_RESPONSE_FORMAT's kind of output) and one
embedding call (exactly 1,536 dimensions), with the ai-worker's own settings. Prints one
line per check and exits 0 when both pass, 1 when one fails — before any worker spends a
job's tries finding out. With AI_PROVIDER=local there is nothing to check.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from san_ai_worker.ai.provider import build_provider
from san_ai_worker.settings import AiWorkerSettings
from san_common import cli
from san_common.errors import JobFailure
from san_common.models.base import EMBEDDING_DIMENSIONS
from san_common.settings import load_settings

PROG = "san-ai-check"
SAMPLE = "Python's GIL lets one thread run Python bytecode at a time; asyncio works around it."


async def check(settings: AiWorkerSettings) -> bool:
    ai = build_provider(settings.ai_provider, **settings.provider_options())
    passed = True
    try:
        try:
            card = await ai.analyze_card(SAMPLE)
            print(
                f"ai: chat ok ({settings.ai_response_format}, {settings.ai_chat_model}): "
                f"card {card.title!r}"
            )
        except JobFailure as exc:
            passed = False
            print(f"ai: chat FAILED ({settings.ai_chat_model}): {exc}", file=sys.stderr)
        try:
            vector = await ai.embed(SAMPLE)
            print(f"ai: embeddings ok ({settings.ai_embedding_model}): {len(vector)} dimensions")
        except JobFailure as exc:
            passed = False
            print(f"ai: embeddings FAILED ({settings.ai_embedding_model}): {exc}", file=sys.stderr)
    finally:
        await ai.aclose()
    return passed


def main(argv: Sequence[str] | None = None) -> int:
    cli.parse(PROG, __doc__ or "", distribution="san-ai-worker", argv=argv)
    settings = load_settings(AiWorkerSettings)
    if settings.ai_provider == "local":
        print(
            f"ai: AI_PROVIDER=local, the offline provider ({EMBEDDING_DIMENSIONS} dimensions); "
            "nothing to check"
        )
        return 0
    return 0 if asyncio.run(check(settings)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
