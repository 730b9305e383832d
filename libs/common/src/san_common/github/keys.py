"""`san-token-keys`: manage `TOKEN_ENCRYPTION_KEYS`.

    san-token-keys generate   print a new key
    san-token-keys rotate     re-encrypt every stored secret with the newest key

Rotating a key: put a new key first in `TOKEN_ENCRYPTION_KEYS` (keep the old ones after
it), roll the services, run `rotate`, then drop the old keys. `rotate` exits non-zero when
a value could not be decrypted with any configured key (then do not drop keys yet).
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from dataclasses import dataclass

from pydantic import model_validator
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common import cli
from san_common.crypto import DecryptionFailed, Purpose, TokenCipher, generate_key, resolve_keys
from san_common.db.engine import create_engine, create_session_factory
from san_common.dependencies import database_failure
from san_common.models import GithubAccount, GithubOAuthState
from san_common.settings import ServiceSettings, load_settings

BATCH = 200


class KeySettings(ServiceSettings):
    service_name: str = "token-keys"
    token_encryption_keys: str = ""

    @model_validator(mode="after")
    def _keys(self) -> KeySettings:
        resolved = resolve_keys(
            self.token_encryption_keys, san_env=self.san_env, data_dir=self.data_dir
        )
        object.__setattr__(self, "token_encryption_keys", resolved)
        return self


@dataclass
class Tally:
    reencrypted: int = 0
    current: int = 0
    undecryptable: int = 0

    def __str__(self) -> str:
        return (
            f"re-encrypted {self.reencrypted}, already current {self.current}, "
            f"undecryptable {self.undecryptable}"
        )


@dataclass(frozen=True)
class RotationReport:
    accounts: Tally
    oauth_states: Tally

    @property
    def complete(self) -> bool:
        return not (self.accounts.undecryptable or self.oauth_states.undecryptable)


async def rotate(sessions: async_sessionmaker[AsyncSession], cipher: TokenCipher) -> RotationReport:
    """Re-encrypt GitHub tokens and pending OAuth verifiers with the newest key.

    Batches are locked (`FOR UPDATE`) while rewritten, so a user relinking at the same time
    is neither lost nor overwritten; the command is safe to run again.
    """
    return RotationReport(
        accounts=await _rotate_accounts(sessions, cipher),
        oauth_states=await _rotate_oauth_states(sessions, cipher),
    )


async def _rotate_accounts(
    sessions: async_sessionmaker[AsyncSession], cipher: TokenCipher
) -> Tally:
    tally = Tally()
    after: uuid.UUID | None = None
    while True:
        async with sessions() as session, session.begin():
            query = select(GithubAccount.user_id, GithubAccount.encrypted_token)
            if after is not None:
                query = query.where(GithubAccount.user_id > after)
            rows = (
                await session.execute(
                    query.order_by(GithubAccount.user_id).limit(BATCH).with_for_update()
                )
            ).all()
            for user_id, stored in rows:
                new = _reencrypt(cipher, stored, user_id, Purpose.GITHUB_TOKEN, tally)
                if new is not None:
                    await session.execute(
                        update(GithubAccount)
                        .where(GithubAccount.user_id == user_id)
                        .values(encrypted_token=new)
                    )
        if len(rows) < BATCH:
            return tally
        after = rows[-1][0]


async def _rotate_oauth_states(
    sessions: async_sessionmaker[AsyncSession], cipher: TokenCipher
) -> Tally:
    tally = Tally()
    after = ""
    while True:
        async with sessions() as session, session.begin():
            rows = (
                await session.execute(
                    select(
                        GithubOAuthState.state_hash,
                        GithubOAuthState.user_id,
                        GithubOAuthState.encrypted_code_verifier,
                    )
                    .where(GithubOAuthState.state_hash > after)
                    .order_by(GithubOAuthState.state_hash)
                    .limit(BATCH)
                    .with_for_update()
                )
            ).all()
            for state_hash, user_id, stored in rows:
                new = _reencrypt(cipher, stored, user_id, Purpose.OAUTH_VERIFIER, tally)
                if new is not None:
                    await session.execute(
                        update(GithubOAuthState)
                        .where(GithubOAuthState.state_hash == state_hash)
                        .values(encrypted_code_verifier=new)
                    )
        if len(rows) < BATCH:
            return tally
        after = rows[-1][0]


def _reencrypt(
    cipher: TokenCipher, stored: str, user_id: uuid.UUID, purpose: Purpose, tally: Tally
) -> str | None:
    try:
        if cipher.is_current(stored):
            tally.current += 1
            return None
        new = cipher.reencrypt(stored, user_id=user_id, purpose=purpose)
    except DecryptionFailed:
        tally.undecryptable += 1
        return None
    tally.reencrypted += 1
    return new


async def _rotate_main(settings: KeySettings) -> int:
    engine = create_engine(settings.database_url, pool_size=1)
    try:
        report = await rotate(
            create_session_factory(engine), TokenCipher.from_setting(settings.token_encryption_keys)
        )
    finally:
        await engine.dispose()
    print(f"github tokens: {report.accounts}")
    print(f"oauth verifiers: {report.oauth_states}")
    if not report.complete:
        print(
            "some values did not decrypt with any configured key; keep the old keys",
            file=sys.stderr,
        )
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser("san-token-keys", __doc__ or "", distribution="san-common")
    parser.add_argument("command", choices=("generate", "rotate"))
    args = parser.parse_args(argv)
    if args.command == "generate":
        print(generate_key())
        return 0
    settings = load_settings(KeySettings)
    if not settings.database_url:
        print("san-token-keys: DATABASE_URL is not set", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_rotate_main(settings))
    except cli.STARTUP_ERRORS as exc:
        raise database_failure("san-token-keys", settings.database_url, exc) from None


if __name__ == "__main__":
    sys.exit(main())
