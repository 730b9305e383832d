"""The OAuth web flow (docs/reference/job-rules.md §4), bound to the user who started it.

An unguessable single-use `state` names the user who started the flow; PKCE (S256) proves
the code is exchanged by whoever asked for it. Only the state's SHA-256 is stored, with the
PKCE verifier encrypted for that user.

GitHub's redirect (`GET /github/oauth/callback`) links nothing: it carries no credential of
ours, so anyone's browser can be sent there with anyone's `state` (account-linking CSRF).
The link is made by `POST /me/github/oauth/complete`, authenticated with the caller's own
bearer token, and only when that caller is the user the state was issued to. See
docs/github.md ("Why the callback links nothing").
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from san_api import errors
from san_api.github import repository, service
from san_api.github.clients import GithubServices
from san_api.github.upstream import github_errors, public_reason
from san_api.settings import ApiSettings
from san_common.crypto import DecryptionFailed, Purpose
from san_common.github import (
    GithubPermanentError,
    code_challenge,
    new_code_verifier,
    new_state,
)
from san_common.models import GithubAccount


def state_hash(state: str) -> str:
    return hashlib.sha256(state.encode("utf-8")).hexdigest()


async def start(
    session: AsyncSession, github: GithubServices, settings: ApiSettings, user_id: uuid.UUID
) -> tuple[str, datetime]:
    """The authorize URL to send the browser to, and when it stops being accepted."""
    if not github.oauth.configured:
        raise errors.OAuthNotConfigured()
    state, verifier = new_state(), new_code_verifier()
    expires_at = datetime.now(UTC) + timedelta(seconds=settings.github_oauth_state_ttl_seconds)
    await repository.prune_oauth_states(session, user_id)
    # with the one inserted below: at most GITHUB_OAUTH_STATES_PER_USER unused states
    await repository.keep_newest_oauth_states(
        session, user_id, settings.github_oauth_states_per_user - 1
    )
    await repository.insert_oauth_state(
        session,
        state_hash=state_hash(state),
        user_id=user_id,
        encrypted_code_verifier=github.cipher.encrypt(
            verifier, user_id=user_id, purpose=Purpose.OAUTH_VERIFIER
        ),
        expires_at=expires_at,
    )
    url = github.oauth.authorize_url(
        state=state,
        challenge=code_challenge(verifier),
        redirect_uri=settings.github_oauth_redirect_url or None,
    )
    return url, expires_at


COMPLETE_HINT = "POST /me/github/oauth/complete with this code and state and your own bearer token"


def callback(*, code: str | None, state: str | None, error: str | None) -> dict[str, object]:
    """Check the redirect's shape only; the state is looked at when the user completes."""
    if error:
        raise errors.OAuthCodeRejected(f"GitHub reported '{error[:80]}'; start the link again")
    if not state:
        raise errors.OAuthStateInvalid("the callback has no state")
    if not code:
        raise errors.OAuthCodeRejected("the callback has no code")
    return {"code": code, "state": state, "linked": False, "next": COMPLETE_HINT}


async def complete(
    session: AsyncSession,
    github: GithubServices,
    settings: ApiSettings,
    user_id: uuid.UUID,
    *,
    code: str,
    state: str,
) -> GithubAccount:
    """Consume the state, check it is the caller's, exchange the code, store the token.

    A state of another user is burnt (the error keeps that write), so a victim's code can
    never be redeemed for the attacker's account afterwards. Any other failure writes
    nothing: the user may retry with the same state until it expires; a success can never
    be replayed.
    """
    consumed = await repository.consume_oauth_state(session, state_hash(state))
    if consumed is None:
        raise errors.OAuthStateInvalid("the state is unknown, expired or already used")
    if consumed.user_id != user_id:
        raise errors.OAuthStateNotYours(
            "this authorization was started from another SAN account; nothing was linked and "
            "the authorization is void. Start linking from your own account."
        )
    try:
        verifier = github.cipher.decrypt(
            consumed.encrypted_code_verifier,
            user_id=consumed.user_id,
            purpose=Purpose.OAUTH_VERIFIER,
        )
    except DecryptionFailed:
        raise errors.OAuthStateInvalid("the state can no longer be verified; start again") from None
    with github_errors():
        try:
            token = await github.oauth.exchange_code(
                code=code,
                verifier=verifier,
                redirect_uri=settings.github_oauth_redirect_url or None,
            )
        except GithubPermanentError as exc:
            raise errors.OAuthCodeRejected(public_reason(exc)) from None
    return await service.link(session, github, user_id, token)
