"""`LocalProvider`: offline and deterministic text statistics, clearly not an LLM.

It is the default when no AI server is configured, so that a local run works end to end:
extractive titles and summaries, keyword tags, template TILs and quizzes, and hashed
bag-of-words embeddings in which texts that share words are near each other.
"""

from __future__ import annotations

import datetime
import hashlib
import itertools
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TypeVar

from pydantic import BaseModel

from san_ai_worker.ai.schemas import (
    CardAnalysis,
    CardInput,
    Quiz,
    RecallQuizSet,
    ScrapRefine,
    StarInput,
    StarRecommendation,
    StarRecommendations,
    Til,
    check_quiz_types,
)
from san_common import usage
from san_common.errors import PermanentJobError
from san_common.models.base import EMBEDDING_DIMENSIONS
from san_common.usage import Prices, estimate_tokens

AnswerT = TypeVar("AnswerT", bound=BaseModel)

TITLE_MAX = 80
SUMMARY_MAX = 400
MAX_TAGS = 5
MAX_QUIZZES = 10
MAX_RECOMMENDATIONS = 10
BIGRAM_WEIGHT = 0.5

_WORD = re.compile(r"\w+")
_SENTENCE_ENDS = ".!?\u3002\uff01\uff1f"  # and the CJK full stop, exclamation, question marks
_SENTENCE_BREAK = re.compile(rf"(?<=[{_SENTENCE_ENDS}])\s+|\n+")
_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff"))
_STOPWORDS = frozenset(
    """
    a about after all also an and any are as at be because been before between both but by
    can could did do does each few for from had has have here how i if in into is it its just
    may more most my no not of on only or other our over same so some such than that the their
    them then there these they this those to too use used using very via was we were what when
    where which while who why will with would you your
    그리고 하지만 그러나 그래서 또는 또한 및 등 이 그 저 것 수 있다 있는 있고 없다 없는 한다 하는
    하고 했다 된다 되는 위해 통해 대한 대해 때 더 매우 같은 이런 그런 우리 이것 그것
    """.split()
)
# Korean particles glue onto the word before them ("파이썬은", "파이썬을"); without stripping
# them the same word would count as several.
_PARTICLES = (
    "에서는", "으로는", "에게서", "까지", "부터", "에서", "으로", "에게", "처럼", "보다",
    "은", "는", "을", "를", "의", "에", "로", "가", "와", "과", "도",
)  # fmt: skip
_CATEGORIES = {
    "programming": """python rust java javascript typescript golang kotlin swift ruby scala
        haskell compiler function functions class classes async asyncio coroutine algorithm
        algorithms programming code coding library refactoring 파이썬 자바 알고리즘 함수
        프로그래밍 코드 비동기""",
    "database": """sql database databases postgresql postgres mysql sqlite mongodb redis
        index indexes query queries transaction transactions pgvector schema 데이터베이스
        쿼리 인덱스 트랜잭션""",
    "devops": """docker kubernetes k8s helm terraform ansible ci deploy deployment container
        containers nginx linux monitoring prometheus 배포 컨테이너 쿠버네티스 도커 모니터링""",
    "ai": """ai llm llms gpt embedding embeddings transformer transformers neural
        machine learning model models 인공지능 머신러닝 딥러닝 임베딩 모델""",
    "web": """http html css react vue frontend backend browser rest fastapi django flask
        web api 프론트엔드 백엔드 웹""",
}
_CATEGORY_WORDS = {name: frozenset(words.split()) for name, words in _CATEGORIES.items()}


CHAT_MODEL = "local"
EMBEDDING_MODEL = "local-embedding"


class LocalProvider:
    """Deterministic stand-in for an AI server; needs no network and no model. It reports
    usage like a server would (models `local` and `local-embedding`), its tokens estimated
    from the texts' lengths, so a local run shows the ledger and budgets at work."""

    def __init__(self, prices: Prices | None = None) -> None:
        self._prices = prices or Prices()

    async def aclose(self) -> None:
        return None

    async def analyze_card(self, content: str) -> CardAnalysis:
        text = content.strip()
        if not text:
            raise PermanentJobError("scrap content is empty")
        title, body = _title_and_body(text)
        words = words_of(text)
        answer = CardAnalysis(
            title=title,
            summary=_summary(body) or title,
            tags=_keywords(words, MAX_TAGS),
            category=_category(words),
        )
        return self._chat(content, answer)

    def _chat(self, prompt: str, answer: AnswerT) -> AnswerT:
        completion = answer.model_dump_json()
        prompt_tokens, completion_tokens = estimate_tokens(prompt), estimate_tokens(completion)
        usage.record(
            usage.AiCall(
                model=CHAT_MODEL,
                call="chat",
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                embedding_tokens=0,
                estimated=True,
                latency_ms=0,
                cost_usd=self._prices.cost(CHAT_MODEL, prompt_tokens, completion_tokens, 0),
            )
        )
        return answer

    async def refine_scrap(self, content: str) -> ScrapRefine:
        text = content.replace("\r\n", "\n").replace("\r", "\n").translate(_INVISIBLE)
        lines = []
        for line in text.split("\n"):
            # Keep the indentation (code, nested lists); collapse every other run of spaces.
            indent = line[: len(line) - len(line.lstrip(" \t"))]
            rest = " ".join(line.split())
            lines.append(indent + rest if rest else "")
        refined = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
        if not refined:
            raise PermanentJobError("scrap content is empty")
        return self._chat(content, ScrapRefine(refinedContent=refined))

    async def write_til(self, target_date: datetime.date, cards: Sequence[CardInput]) -> Til:
        day = target_date.isoformat()
        prompt = "\n".join(f"{card.title}\n{card.summary}" for card in cards)
        if not cards:
            return self._chat(
                prompt,
                Til(
                    title=f"TIL {day}",
                    tilMarkdown=f"# TIL {day}\n\nNo knowledge cards were saved on this day.\n",
                ),
            )
        sections = [f"# TIL {day}"]
        for card in cards:
            parts = [f"## {_one_line(card.title)}", card.summary.strip()]
            if card.category:
                parts.append(f"Category: {card.category}")
            tags = [
                tag for tag in ("-".join(t.lower().lstrip("#").split()) for t in card.tags) if tag
            ]
            if tags:
                parts.append("Tags: " + " ".join(f"#{tag}" for tag in tags))
            sections.append("\n\n".join(part for part in parts if part))
        title = _clip(f"TIL {day}: {_one_line(cards[0].title)}", 120)
        return self._chat(prompt, Til(title=title, tilMarkdown="\n\n".join(sections) + "\n"))

    async def make_quizzes(
        self, cards: Sequence[CardInput], quiz_types: Sequence[str]
    ) -> RecallQuizSet:
        requested = check_quiz_types(quiz_types)
        # Card by card, every requested type for each, so a cap of 10 still covers all types.
        quizzes = (
            _ox_quiz(card) if quiz_type == "OX" else _short_answer_quiz(card)
            for card in cards
            for quiz_type in requested
        )
        answer = RecallQuizSet(quizzes=list(itertools.islice(quizzes, MAX_QUIZZES)))
        return self._chat("\n".join(f"{c.title}\n{c.summary}" for c in cards), answer)

    async def recommend_stars(
        self, stars: Sequence[StarInput], interests: Sequence[str]
    ) -> StarRecommendations:
        wanted = set(words_of(" ".join(interests)))
        ranked = []
        for star in stars:
            described = [star.full_name, star.description or "", *star.topics, star.language or ""]
            matched = sorted(wanted & set(words_of(" ".join(described))))
            if matched:
                ranked.append(
                    StarRecommendation(
                        repoFullName=star.full_name,
                        reason=f"Matches what you are learning: {', '.join(matched)}",
                        score=round(len(matched) / len(wanted), 3),
                    )
                )
        ranked.sort(key=lambda rec: (-rec.score, rec.repoFullName))
        answer = StarRecommendations(recommendations=ranked[:MAX_RECOMMENDATIONS])
        return self._chat(" ".join([*interests, *(s.full_name for s in stars)]), answer)

    async def embed(self, text: str) -> list[float]:
        tokens = estimate_tokens(text)
        usage.record(
            usage.AiCall(
                model=EMBEDDING_MODEL,
                call="embedding",
                prompt_tokens=0,
                completion_tokens=0,
                embedding_tokens=tokens,
                estimated=True,
                latency_ms=0,
                cost_usd=self._prices.cost(EMBEDDING_MODEL, 0, 0, tokens),
            )
        )
        return embedding_of(text)


def words_of(text: str) -> list[str]:
    """Lowercased word tokens (any script), particles and stopwords removed."""
    words = []
    for token in _WORD.findall(text.lower()):
        word = _strip_particle(token.strip("_"))
        if len(word) > 1 and not word.isdigit() and word not in _STOPWORDS:
            words.append(word)
    return words


def embedding_of(text: str) -> list[float]:
    """Feature-hashed bag of words and bigrams, unit length, `EMBEDDING_DIMENSIONS` floats."""
    words = words_of(text)
    features = [(f"w:{word}", 1 + math.log(n)) for word, n in Counter(words).items()]
    features += [
        (f"b:{a} {b}", BIGRAM_WEIGHT * (1 + math.log(n)))
        for (a, b), n in Counter(itertools.pairwise(words)).items()
    ]
    vector = [0.0] * EMBEDDING_DIMENSIONS
    for feature, weight in features:
        # blake2b, not hash(): Python salts str hashes per process, and embeddings are stored.
        digest = int.from_bytes(hashlib.blake2b(feature.encode(), digest_size=8).digest(), "big")
        sign = 1.0 if digest >> 63 else -1.0  # the sign trick keeps collisions unbiased
        vector[digest % EMBEDDING_DIMENSIONS] += sign * weight
    norm = math.sqrt(sum(v * v for v in vector))
    if norm == 0.0:
        # No words at all: a fixed unit vector, since a zero vector has no cosine distance.
        return [1.0] + [0.0] * (EMBEDDING_DIMENSIONS - 1)
    return [v / norm for v in vector]


def _strip_particle(word: str) -> str:
    if word and "\uac00" <= word[-1] <= "\ud7a3":
        for particle in _PARTICLES:
            if word.endswith(particle) and len(word) - len(particle) >= 2:
                return word[: -len(particle)]
    return word


def _sentences(text: str) -> list[str]:
    return [part for part in (_one_line(s) for s in _SENTENCE_BREAK.split(text)) if part]


def _title_and_body(text: str) -> tuple[str, str]:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0].lstrip("#").strip() or lines[0]
    # A short first line without a full stop reads as a heading: it is the title.
    if len(lines) > 1 and len(first) <= TITLE_MAX and not first.endswith(tuple(_SENTENCE_ENDS)):
        return first, "\n".join(lines[1:])
    return _clip(_sentences(first)[0], TITLE_MAX), text


def _summary(body: str) -> str:
    picked: list[str] = []
    for sentence in _sentences(body)[:3]:
        if picked and len(" ".join([*picked, sentence])) > SUMMARY_MAX:
            break
        picked.append(sentence)
    return _clip(" ".join(picked), SUMMARY_MAX)


def _keywords(words: Iterable[str], limit: int) -> list[str]:
    counts = Counter(words)
    return [word for word, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]]


def _category(words: Sequence[str]) -> str:
    scores = {name: sum(w in vocab for w in words) for name, vocab in _CATEGORY_WORDS.items()}
    best = max(sorted(scores), key=lambda name: scores[name])
    return best if scores[best] else "general"


def _ox_quiz(card: CardInput) -> Quiz:
    sentences = _sentences(card.summary)
    statement = sentences[0] if sentences else f"This card is about {_one_line(card.title)}."
    return Quiz(
        type="OX",
        question=f"O or X? {statement}",
        answer="O",
        explanation=f'The card "{_one_line(card.title)}" states this.',
    )


def _short_answer_quiz(card: CardInput) -> Quiz:
    title, summary = _one_line(card.title), _one_line(card.summary)
    explanation = f'From the card "{title}".'
    for keyword in [*card.tags, *_keywords(words_of(summary), MAX_TAGS)]:
        keyword = keyword.strip()
        # Not inside a longer Latin word, but Korean particles may follow the keyword.
        pattern = re.compile(rf"(?<![a-z0-9]){re.escape(keyword)}(?![a-z0-9])", re.IGNORECASE)
        if keyword and pattern.search(summary):
            return Quiz(
                type="SHORT_ANSWER",
                question=f"Fill in the blank: {pattern.sub('____', summary)}",
                answer=keyword,
                explanation=explanation,
            )
    return Quiz(
        type="SHORT_ANSWER",
        question=f"Which topic does this describe? {summary or title}",
        answer=title,
        explanation=explanation,
    )


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    if " " in cut[limit // 2 :]:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip() + "…"
