"""SCRAM-SHA-256: analysts' password verifiers, and the server side of the exchange (pure).

Verifiers use PostgreSQL's format, ``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>``
(base64 fields), so the ``users`` section of config.yaml never holds a password and a verifier
can be copied from ``pg_authid.rolpassword``. ``dpproxy passwd`` prints one.

The exchange follows RFC 5802 / RFC 7677 as PostgreSQL speaks it: the user name comes from the
startup packet (libpq sends an empty ``n=`` in its client-first-message), channel binding is not
offered, and an unknown user runs through the same exchange against a made-up verifier, so
timing and messages never tell an unknown user from a wrong password.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Final

import scramp

from proxy.errors import InvalidPassword, ProtocolViolation

__all__ = [
    "MECHANISM",
    "Verifier",
    "make_verifier",
    "parse_verifier",
    "ScramExchange",
    "md5_password",
    "passthrough_password",
]

#: The only SASL mechanism dpproxy offers.
MECHANISM: Final = "SCRAM-SHA-256"
_DEFAULT_ITERATIONS: Final = 4096
_NONCE_BYTES: Final = 18


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ValueError(f"{what} is not valid base64") from None


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


@dataclass(frozen=True, slots=True)
class Verifier:
    """What the server keeps of a password: salt, iterations and the two derived keys."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def __post_init__(self) -> None:
        if not self.salt:
            raise ValueError("the salt is empty")
        if self.iterations < 1:
            raise ValueError("the iteration count must be positive")
        if len(self.stored_key) != 32 or len(self.server_key) != 32:
            raise ValueError("StoredKey and ServerKey must be 32 bytes (SHA-256)")

    def __repr__(self) -> str:  # keys stay out of logs and tracebacks
        return f"Verifier(iterations={self.iterations})"

    def __str__(self) -> str:
        return (
            f"{MECHANISM}${self.iterations}:{_b64(self.salt)}"
            f"${_b64(self.stored_key)}:{_b64(self.server_key)}"
        )


def make_verifier(
    password: str, *, salt: bytes | None = None, iterations: int = _DEFAULT_ITERATIONS
) -> str:
    """The PostgreSQL-format SCRAM-SHA-256 verifier of ``password``.

    Args:
        password: the password (SASLprepped as PostgreSQL does).
        salt: a fixed salt, for reproducible output; 16 random bytes by default.
        iterations: the PBKDF2 iteration count.

    Returns:
        The verifier text for config.yaml's ``users`` section.

    >>> v = make_verifier("analyst", salt=b"0123456789abcdef")
    >>> v.split("$")[1]
    '4096:MDEyMzQ1Njc4OWFiY2RlZg=='
    >>> parse_verifier(v).iterations
    4096
    """
    salt, stored_key, server_key, count = scramp.ScramMechanism(MECHANISM).make_auth_info(
        password,
        iteration_count=iterations,
        salt=salt if salt is not None else secrets.token_bytes(16),
    )
    return str(Verifier(salt, int(count), stored_key, server_key))


def parse_verifier(text: str) -> Verifier:
    """Read a verifier in PostgreSQL's format.

    Raises:
        ValueError: the text is not a SCRAM-SHA-256 verifier (e.g. a plain password).

    >>> parse_verifier("analyst")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: not a SCRAM-SHA-256 verifier (expected SCRAM-SHA-256$<iterations>:...)
    """
    mechanism, _, rest = text.partition("$")
    head, _, keys = rest.partition("$")
    iterations, _, salt = head.partition(":")
    stored, _, server = keys.partition(":")
    if mechanism != MECHANISM or not (iterations.isdigit() and salt and stored and server):
        raise ValueError(
            f"not a {MECHANISM} verifier "
            f"(expected {MECHANISM}$<iterations>:<salt>$<StoredKey>:<ServerKey>)"
        )
    return Verifier(
        _unb64(salt, "salt"),
        int(iterations),
        _unb64(stored, "StoredKey"),
        _unb64(server, "ServerKey"),
    )


def _attributes(message: str, what: str) -> list[tuple[str, str]]:
    pairs = []
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=":
            raise ProtocolViolation(f"malformed SCRAM {what} message")
        pairs.append((part[0], part[2:]))
    return pairs


class ScramExchange:
    """The server side of one SCRAM-SHA-256 exchange.

    Client-first in, server-first out; client-final in, server-final out.

    Args:
        user: the user name from the startup packet (used only in error messages).
        verifier: the user's verifier, or None for an unknown user (the exchange runs against a
            made-up verifier and fails at the end, like a wrong password).
        mock_secret: a per-server secret that makes the made-up salt stable per user name.
        nonce: the server nonce; random unless a test fixes it.

    >>> from scramp import ScramClient
    >>> verifier = parse_verifier(make_verifier("pw", salt=b"s" * 16))
    >>> client = ScramClient([MECHANISM], "ann", "pw")
    >>> server = ScramExchange("ann", verifier, b"k")
    >>> client.set_server_first(server.first(client.get_client_first().encode()).decode())
    >>> client.set_server_final(server.final(client.get_client_final().encode()).decode())
    """

    def __init__(
        self, user: str, verifier: Verifier | None, mock_secret: bytes, nonce: str | None = None
    ) -> None:
        self._user = user
        self._known = verifier is not None
        self._verifier = verifier or Verifier(
            _hmac(mock_secret, b"salt:" + user.encode("utf-8"))[:16],
            _DEFAULT_ITERATIONS,
            _hmac(mock_secret, b"stored:" + user.encode("utf-8")),
            _hmac(mock_secret, b"server:" + user.encode("utf-8")),
        )
        self._server_nonce = nonce or _b64(secrets.token_bytes(_NONCE_BYTES))
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._gs2 = ""

    def first(self, client_first: bytes) -> bytes:
        """Read the client-first-message; return the server-first-message.

        Raises:
            ProtocolViolation: malformed, or asks for channel binding or an authzid.
        """
        text = _decode(client_first)
        flag, _, rest = text.partition(",")
        authzid, _, bare = rest.partition(",")
        if flag not in ("n", "y"):
            # "p=..." asks for channel binding, which we never offer (no -PLUS mechanism)
            raise ProtocolViolation(
                "SCRAM channel binding is not supported", hint="connect without channel binding"
            )
        if authzid:
            raise ProtocolViolation("SCRAM authorization identities are not supported")
        attributes = dict(_attributes(bare, "client-first"))
        client_nonce = attributes.get("r", "")
        if "n" not in attributes or not client_nonce or "m" in attributes:
            raise ProtocolViolation("malformed SCRAM client-first message")
        self._gs2 = f"{flag},,"
        self._client_first_bare = bare
        self._nonce = client_nonce + self._server_nonce
        self._server_first = (
            f"r={self._nonce},s={_b64(self._verifier.salt)},i={self._verifier.iterations}"
        )
        return self._server_first.encode("ascii")

    def final(self, client_final: bytes) -> bytes:
        """Check the client-final-message's proof; return the server-final-message.

        Raises:
            ProtocolViolation: malformed, or out of order.
            InvalidPassword: the proof is wrong, or the user is unknown.
        """
        if not self._server_first:
            raise ProtocolViolation("SCRAM client-final message before client-first")
        text = _decode(client_final)
        without_proof, _, proof_attr = text.rpartition(",")
        attributes = dict(_attributes(without_proof, "client-final"))
        if not proof_attr.startswith("p="):
            raise ProtocolViolation("malformed SCRAM client-final message: no proof")
        if attributes.get("c") != _b64(self._gs2.encode("ascii")):
            raise ProtocolViolation("SCRAM channel binding does not match")
        if attributes.get("r") != self._nonce:
            raise ProtocolViolation("SCRAM nonce does not match")
        try:
            proof = _unb64(proof_attr[2:], "proof")
        except ValueError:
            raise ProtocolViolation("malformed SCRAM client-final message: bad proof") from None
        auth_message = ",".join(
            (self._client_first_bare, self._server_first, without_proof)
        ).encode("utf-8")
        signature = _hmac(self._verifier.stored_key, auth_message)
        if len(proof) != len(signature):
            raise self._failed()
        client_key = bytes(a ^ b for a, b in zip(proof, signature))
        matches = hmac.compare_digest(
            hashlib.sha256(client_key).digest(), self._verifier.stored_key
        )
        if not (matches and self._known):
            raise self._failed()
        return f"v={_b64(_hmac(self._verifier.server_key, auth_message))}".encode("ascii")

    def _failed(self) -> InvalidPassword:
        return InvalidPassword(f'password authentication failed for user "{self._user}"')


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolViolation("SCRAM message is not valid UTF-8") from None


def md5_password(user: str, password: str, salt: bytes) -> str:
    """The PasswordMessage a client sends after AuthenticationMD5Password (for the upstream).

    >>> md5_password("u", "p", b"abcd")
    'md5fa55bd30a96b8d5bd8215eee7c50a918'
    """
    inner = hashlib.md5((password + user).encode("utf-8")).hexdigest()
    return "md5" + hashlib.md5(inner.encode("ascii") + salt).hexdigest()


def passthrough_password(secret: str, role: str) -> str:
    """The password of pass-through role ``role``: an HMAC of its name under ``secret``.

    `dpproxy provision` installs its SCRAM verifier; dpproxy derives it again to log in, so no
    per-analyst password is stored anywhere.

    >>> passthrough_password("s", "dpproxy_pt_alice")
    'EaahoPwfj1-ahDiLJmSsMmJL_C2loFn-oINT41-188c'
    """
    digest = hmac.new(secret.encode(), b"dpproxy passthrough\0" + role.encode(), "sha256")
    return base64.urlsafe_b64encode(digest.digest()).decode().rstrip("=")
