"""Encryption of stored secrets (GitHub tokens, OAuth PKCE verifiers); the rules are
docs/reference/job-rules.md §4.

AES-256-GCM; the associated data binds each value to its owner's user id and to its
purpose, so a value copied into another user's row (or into another column) does not
decrypt. Stored form:

    v1:<kid>:<base64url(nonce ‖ ciphertext ‖ tag)>

`kid` names the key (the first 8 hex digits of the key's SHA-256), so keys can rotate:
`TOKEN_ENCRYPTION_KEYS` lists keys newest first; values are encrypted with the first and
decrypted with whichever the value names. `san-token-keys rotate` re-encrypts every stored
value with the newest key, after which the older keys can be dropped.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import secrets
import uuid
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from san_common.local_secrets import PLACEHOLDERS, local_secret

FORMAT_VERSION = "v1"
KEY_BYTES = 32
NONCE_BYTES = 12
LOCAL_SECRET_NAME = "token_encryption_keys"
_BASE64URL = re.compile(r"[A-Za-z0-9_-]+={0,2}")


class Purpose(StrEnum):
    """What a value is; part of the associated data, so values cannot swap columns."""

    GITHUB_TOKEN = "github-token"
    OAUTH_VERIFIER = "oauth-verifier"


class InvalidKeys(ValueError):
    """`TOKEN_ENCRYPTION_KEYS` is missing, a placeholder, or not base64url of 32 bytes."""


class DecryptionFailed(Exception):
    """The value is damaged, belongs to another user or purpose, or its key is not configured.

    The message never contains the value or any key.
    """


def generate_key() -> str:
    """A fresh key in the form `TOKEN_ENCRYPTION_KEYS` expects (base64url of 32 random bytes)."""
    return base64.urlsafe_b64encode(secrets.token_bytes(KEY_BYTES)).decode().rstrip("=")


def key_id(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()[:8]


def parse_keys(configured: str) -> tuple[bytes, ...]:
    """The keys of a comma-separated `TOKEN_ENCRYPTION_KEYS`, newest first."""
    keys: list[bytes] = []
    for position, raw in enumerate((part.strip() for part in configured.split(",")), start=1):
        if not raw:
            continue
        if raw.lower() in PLACEHOLDERS:
            raise InvalidKeys(f"TOKEN_ENCRYPTION_KEYS key #{position} is a placeholder")
        try:
            if not _BASE64URL.fullmatch(raw):
                raise ValueError
            key = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
        except (binascii.Error, ValueError):
            raise InvalidKeys(f"TOKEN_ENCRYPTION_KEYS key #{position} is not base64url") from None
        if len(key) != KEY_BYTES:
            raise InvalidKeys(
                f"TOKEN_ENCRYPTION_KEYS key #{position} must decode to {KEY_BYTES} bytes, "
                f"not {len(key)}; make one with `san-token-keys generate`"
            )
        keys.append(key)
    if not keys:
        raise InvalidKeys("TOKEN_ENCRYPTION_KEYS holds no key")
    if len({key_id(k) for k in keys}) != len(keys):
        raise InvalidKeys("TOKEN_ENCRYPTION_KEYS lists the same key twice")
    return tuple(keys)


def resolve_keys(configured: str, *, san_env: str, data_dir: Path) -> str:
    """The configured keys, checked; in a local run without any, a key generated once into
    the data directory (and reused by every process sharing it). Production refuses to
    start without real keys."""
    if not configured.strip():
        if san_env == "production":
            raise InvalidKeys("TOKEN_ENCRYPTION_KEYS must be set when SAN_ENV=production")
        configured = local_secret(data_dir, LOCAL_SECRET_NAME, generate_key)
    parse_keys(configured)
    return configured


class TokenCipher:
    """Encrypts with the newest key, decrypts with any configured one."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise InvalidKeys("at least one key is needed")
        self._keys = {key_id(k): AESGCM(k) for k in keys}
        self._current = key_id(keys[0])

    @classmethod
    def from_setting(cls, configured: str) -> TokenCipher:
        return cls(parse_keys(configured))

    @property
    def current_key_id(self) -> str:
        return self._current

    def encrypt(self, plaintext: str, *, user_id: uuid.UUID, purpose: Purpose) -> str:
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._keys[self._current].encrypt(
            nonce, plaintext.encode("utf-8"), _associated_data(user_id, purpose)
        )
        encoded = base64.urlsafe_b64encode(nonce + sealed).decode().rstrip("=")
        return f"{FORMAT_VERSION}:{self._current}:{encoded}"

    def decrypt(self, stored: str, *, user_id: uuid.UUID, purpose: Purpose) -> str:
        version, kid, blob = _split(stored)
        if version != FORMAT_VERSION:
            raise DecryptionFailed(f"unknown encrypted value format {version!r}")
        aead = self._keys.get(kid)
        if aead is None:
            raise DecryptionFailed(
                f"the value was encrypted with key {kid}, which is not configured"
            )
        try:
            raw = base64.urlsafe_b64decode(blob + "=" * (-len(blob) % 4))
            plaintext = aead.decrypt(
                raw[:NONCE_BYTES], raw[NONCE_BYTES:], _associated_data(user_id, purpose)
            )
        except (InvalidTag, binascii.Error, ValueError):
            raise DecryptionFailed(
                "the value does not decrypt for this user (damaged, or copied from another row)"
            ) from None
        return plaintext.decode("utf-8")

    def key_id_of(self, stored: str) -> str:
        return _split(stored)[1]

    def is_current(self, stored: str) -> bool:
        return self.key_id_of(stored) == self._current

    def reencrypt(self, stored: str, *, user_id: uuid.UUID, purpose: Purpose) -> str:
        """The same secret under the newest key (a fresh nonce either way)."""
        return self.encrypt(
            self.decrypt(stored, user_id=user_id, purpose=purpose), user_id=user_id, purpose=purpose
        )


def _associated_data(user_id: uuid.UUID, purpose: Purpose) -> bytes:
    return f"san:{purpose.value}:{user_id}".encode()


def _split(stored: str) -> tuple[str, str, str]:
    parts = stored.split(":")
    if len(parts) != 3:
        raise DecryptionFailed("not an encrypted value")
    return parts[0], parts[1], parts[2]
