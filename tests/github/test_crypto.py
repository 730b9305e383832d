"""Token encryption: authenticated, bound to the user and the purpose, key ids and rotation,
and the settings rules (local runs generate a key once; production refuses to start)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from pydantic import ValidationError

from san_ai_worker.settings import AiWorkerSettings
from san_api.settings import ApiSettings
from san_common.crypto import (
    DecryptionFailed,
    InvalidKeys,
    Purpose,
    TokenCipher,
    generate_key,
    key_id,
    parse_keys,
)
from san_github_worker.settings import GithubWorkerSettings

SECRET = "fake_" + "ab" * 20


def test_round_trip_names_its_key_and_hides_the_plaintext() -> None:
    key = generate_key()
    cipher = TokenCipher.from_setting(key)
    alice = uuid.uuid4()
    stored = cipher.encrypt(SECRET, user_id=alice, purpose=Purpose.GITHUB_TOKEN)
    version, kid, _ = stored.split(":")
    assert (version, kid) == ("v1", key_id(parse_keys(key)[0]))
    assert SECRET not in stored and SECRET.encode().hex() not in stored
    assert cipher.decrypt(stored, user_id=alice, purpose=Purpose.GITHUB_TOKEN) == SECRET
    # a fresh nonce each time: equal tokens do not look equal
    assert stored != cipher.encrypt(SECRET, user_id=alice, purpose=Purpose.GITHUB_TOKEN)


def test_a_value_moved_to_another_user_or_column_or_tampered_does_not_decrypt() -> None:
    cipher = TokenCipher.from_setting(generate_key())
    alice, bob = uuid.uuid4(), uuid.uuid4()
    stored = cipher.encrypt(SECRET, user_id=alice, purpose=Purpose.GITHUB_TOKEN)
    with pytest.raises(DecryptionFailed) as other_user:
        cipher.decrypt(stored, user_id=bob, purpose=Purpose.GITHUB_TOKEN)
    with pytest.raises(DecryptionFailed):
        cipher.decrypt(stored, user_id=alice, purpose=Purpose.OAUTH_VERIFIER)
    flipped = stored[:-2] + ("A" if stored[-2] != "A" else "B") + stored[-1]
    with pytest.raises(DecryptionFailed):
        cipher.decrypt(flipped, user_id=alice, purpose=Purpose.GITHUB_TOKEN)
    with pytest.raises(DecryptionFailed):
        cipher.decrypt("not-encrypted", user_id=alice, purpose=Purpose.GITHUB_TOKEN)
    assert SECRET not in str(other_user.value) and stored not in str(other_user.value)


def test_newest_key_encrypts_any_listed_key_decrypts_and_dropped_keys_are_named() -> None:
    old, new = generate_key(), generate_key()
    user = uuid.uuid4()
    before = TokenCipher.from_setting(old).encrypt(
        SECRET, user_id=user, purpose=Purpose.GITHUB_TOKEN
    )
    rotating = TokenCipher.from_setting(f"{new}, {old}")
    assert rotating.decrypt(before, user_id=user, purpose=Purpose.GITHUB_TOKEN) == SECRET
    assert not rotating.is_current(before)
    after = rotating.reencrypt(before, user_id=user, purpose=Purpose.GITHUB_TOKEN)
    assert rotating.is_current(after)
    only_new = TokenCipher.from_setting(new)
    assert only_new.decrypt(after, user_id=user, purpose=Purpose.GITHUB_TOKEN) == SECRET
    with pytest.raises(DecryptionFailed, match="not configured"):
        only_new.decrypt(before, user_id=user, purpose=Purpose.GITHUB_TOKEN)


@pytest.mark.parametrize(
    ("configured", "message"),
    [
        ("", "no key"),
        ("changeme", "placeholder"),
        ("!!not base64!!", "base64"),
        ("c2hvcnQ", "32 bytes"),
    ],
)
def test_bad_key_settings_are_refused(configured: str, message: str) -> None:
    with pytest.raises(InvalidKeys, match=message):
        parse_keys(configured)
    key = generate_key()
    with pytest.raises(InvalidKeys, match="twice"):
        parse_keys(f"{key},{key}")


@pytest.mark.parametrize("settings_class", [ApiSettings, GithubWorkerSettings, AiWorkerSettings])
def test_local_runs_generate_one_key_production_refuses_missing_or_placeholder_keys(
    settings_class: type[ApiSettings | GithubWorkerSettings | AiWorkerSettings],
    tmp_path: Path,
) -> None:
    first = settings_class(
        san_env="development", data_dir=tmp_path, database_url="postgresql://x/y"
    )
    second = settings_class(
        san_env="development", data_dir=tmp_path, database_url="postgresql://x/y"
    )
    assert first.token_encryption_keys == second.token_encryption_keys  # generated once, reused
    parse_keys(first.token_encryption_keys)
    assert first.token_encryption_keys not in repr(first)

    production = {
        "san_env": "production",
        "data_dir": tmp_path,
        "database_url": "postgresql://x/y",
        "auth_jwt_secret": "p" * 40,
    }
    with pytest.raises(ValidationError, match="TOKEN_ENCRYPTION_KEYS must be set"):
        settings_class(**production)
    with pytest.raises(ValidationError, match="placeholder"):
        settings_class(**production, token_encryption_keys="changeme")
    ok = settings_class(**production, token_encryption_keys=generate_key())
    assert ok.san_env == "production"
