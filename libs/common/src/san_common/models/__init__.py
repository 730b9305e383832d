"""ORM models. Every table of the system is declared here so that migrations and
repositories of all services agree on one schema (the DB schema is a wire contract)."""

from san_common.models.base import Base
from san_common.models.cards import Category, KnowledgeCard, Tag, card_tags
from san_common.models.deployment import Deployment
from san_common.models.github import (
    GithubAccount,
    GithubOAuthState,
    GithubRepository,
    GithubStarRecommendation,
    TilGithubCommit,
)
from san_common.models.jobs import (
    AsyncJob,
    AsyncJobTransition,
    AsyncJobTry,
    OutboxBulkLane,
    OutboxMessage,
)
from san_common.models.operations import (
    AdminAudit,
    AsyncJobEvent,
    JobTypePause,
    SweepRequest,
    SweepRun,
    WorkerPresence,
)
from san_common.models.quotas import UpstreamQuota
from san_common.models.rate_limits import RateLimitBucket
from san_common.models.scraps import Scrap
from san_common.models.til import (
    DailySummary,
    RecallQuiz,
    RecallQuizGeneration,
    daily_summary_cards,
)
from san_common.models.usage import AiUsage, UserBudget
from san_common.models.users import User

__all__ = [
    "AdminAudit",
    "AiUsage",
    "AsyncJob",
    "AsyncJobEvent",
    "AsyncJobTransition",
    "AsyncJobTry",
    "Base",
    "Category",
    "DailySummary",
    "Deployment",
    "GithubAccount",
    "GithubOAuthState",
    "GithubRepository",
    "GithubStarRecommendation",
    "JobTypePause",
    "KnowledgeCard",
    "OutboxBulkLane",
    "OutboxMessage",
    "RateLimitBucket",
    "RecallQuiz",
    "RecallQuizGeneration",
    "Scrap",
    "SweepRequest",
    "SweepRun",
    "Tag",
    "TilGithubCommit",
    "UpstreamQuota",
    "User",
    "UserBudget",
    "WorkerPresence",
    "card_tags",
    "daily_summary_cards",
]
