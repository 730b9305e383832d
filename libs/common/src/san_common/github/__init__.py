"""The GitHub REST client, OAuth web flow and error classes shared by the services."""

from san_common.github.client import (
    CommitRef,
    ContentEntry,
    GithubClient,
    GithubRepo,
    GithubUser,
    StarredRepo,
    git_blob_sha,
)
from san_common.github.errors import (
    RELINK_MESSAGE,
    GithubNotFound,
    GithubPermanentError,
    GithubRateLimited,
    GithubTokenRejected,
    GithubTransientError,
)
from san_common.github.oauth import GithubOAuth, code_challenge, new_code_verifier, new_state

__all__ = [
    "RELINK_MESSAGE",
    "CommitRef",
    "ContentEntry",
    "GithubClient",
    "GithubNotFound",
    "GithubOAuth",
    "GithubPermanentError",
    "GithubRateLimited",
    "GithubRepo",
    "GithubTokenRejected",
    "GithubTransientError",
    "GithubUser",
    "StarredRepo",
    "code_challenge",
    "git_blob_sha",
    "new_code_verifier",
    "new_state",
]
