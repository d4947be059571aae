"""The decision-signing keys, read from the environment by the settings.

``RETENTION_SIGNING_KEY`` (or ``…_FILE``): the Ed25519 private key, on the web host only.
``RETENTION_VERIFY_KEY`` (or ``…_FILE``): its public half, on every host. Either as PEM
(``openssl genpkey -algorithm ed25519``; ``openssl pkey -pubout``) or as the 32 raw bytes
in base64. With only the private key set, the public half is derived from it.

Demo mode (``RETENTION_DEMO=1``) with neither set uses the public demo key derived from a
fixed phrase: anyone can sign with it, like the demo ``SECRET_KEY`` — never in production.
"""

from __future__ import annotations

import base64
import binascii
import hashlib

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

DEMO_PHRASE = b"retention-runner public demo decision-signing key, never for production"


class BadKey(ValueError):
    """A key variable that does not hold an Ed25519 key; the message names the variable."""


def demo_private_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(DEMO_PHRASE).digest())


def _raw(name: str, value: bytes) -> bytes:
    try:
        raw = base64.b64decode(value.strip(), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32:
        raise BadKey(f"{name} must be an Ed25519 key: PEM, or its 32 raw bytes in base64")
    return raw


def private_from(name: str, value: bytes | None) -> Ed25519PrivateKey | None:
    if not value:
        return None
    if value.lstrip().startswith(b"-----BEGIN"):
        try:
            key = serialization.load_pem_private_key(value, password=None)
        except (ValueError, TypeError):
            key = None
        if not isinstance(key, Ed25519PrivateKey):
            raise BadKey(f"{name} must be an unencrypted Ed25519 private key")
        return key
    return Ed25519PrivateKey.from_private_bytes(_raw(name, value))


def public_from(name: str, value: bytes | None) -> Ed25519PublicKey | None:
    if not value:
        return None
    if value.lstrip().startswith(b"-----BEGIN"):
        try:
            key = serialization.load_pem_public_key(value)
        except (ValueError, TypeError):
            key = None
        if not isinstance(key, Ed25519PublicKey):
            raise BadKey(f"{name} must be an Ed25519 public key")
        return key
    return Ed25519PublicKey.from_public_bytes(_raw(name, value))


def public_text(key: Ed25519PublicKey) -> str:
    """The public key as the base64 of its raw bytes (what ``RETENTION_VERIFY_KEY`` takes)."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def private_text(key: Ed25519PrivateKey) -> str:
    raw = key.private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )
    return base64.b64encode(raw).decode()


def configured(
    signing: bytes | None, verify: bytes | None, *, demo: bool
) -> tuple[Ed25519PrivateKey | None, Ed25519PublicKey | None]:
    """The (private, public) keys the settings hold; BadKey names a malformed variable or
    a private key that does not match the public one."""
    private = private_from("RETENTION_SIGNING_KEY", signing)
    public = public_from("RETENTION_VERIFY_KEY", verify)
    if private is None and public is None and demo:
        private = demo_private_key()
    if private is not None:
        derived = private.public_key()
        if public is not None and public_text(public) != public_text(derived):
            raise BadKey("RETENTION_SIGNING_KEY is not the private half of RETENTION_VERIFY_KEY")
        public = derived
    return private, public
