"""SCRAM-SHA-256 verifiers and the server side of the exchange (pure; real scramp clients)."""

from __future__ import annotations

import base64

import pytest
from scramp import ScramClient, ScramException

from proxy.auth import MECHANISM, ScramExchange, make_verifier, parse_verifier
from proxy.errors import InvalidPassword, ProtocolViolation

VERIFIER = parse_verifier(make_verifier("s3cret", salt=b"0123456789abcdef"))


def exchange(password: str, verifier: object = VERIFIER, user: str = "ann") -> None:
    client = ScramClient([MECHANISM], user, password)
    server = ScramExchange(user, verifier, b"server secret")  # type: ignore[arg-type]
    client.set_server_first(server.first(client.get_client_first().encode()).decode())
    client.set_server_final(server.final(client.get_client_final().encode()).decode())


def test_right_password() -> None:
    exchange("s3cret")


def test_wrong_password() -> None:
    with pytest.raises(InvalidPassword, match='password authentication failed for user "ann"'):
        exchange("wrong")


def test_unknown_user_fails_the_same_way_with_a_stable_salt() -> None:
    with pytest.raises(InvalidPassword, match='password authentication failed for user "bob"'):
        exchange("s3cret", None, "bob")
    first = [ScramExchange("bob", None, b"k", nonce="N").first(b"n,,n=,r=abc") for _ in range(2)]
    assert first[0] == first[1]  # the same made-up salt each time: no tell-tale change


def test_libpq_empty_user_name_is_accepted() -> None:
    server = ScramExchange("ann", VERIFIER, b"k", nonce="server")
    assert server.first(b"n,,n=,r=client").startswith(
        b"r=clientserver,s=MDEyMzQ1Njc4OWFiY2RlZg==,i=4096"
    )


@pytest.mark.parametrize(
    "first",
    [
        b"p=tls-server-end-point,,n=,r=x",
        b"n,a=admin,n=,r=x",
        b"n,,r=x",
        b"n,,n=,r=",
        b"\xff\xfe",
        b"garbage",
    ],
)
def test_malformed_client_first(first: bytes) -> None:
    with pytest.raises(ProtocolViolation):
        ScramExchange("ann", VERIFIER, b"k").first(first)


def test_client_final_is_checked() -> None:
    server = ScramExchange("ann", VERIFIER, b"k", nonce="S")
    with pytest.raises(ProtocolViolation, match="before client-first"):
        server.final(b"c=biws,r=xS,p=AAAA")
    server.first(b"n,,n=,r=x")
    with pytest.raises(ProtocolViolation, match="nonce"):
        server.final(b"c=biws,r=other,p=AAAA")
    with pytest.raises(ProtocolViolation, match="channel binding"):
        server.final(b"c=eSws,r=xS,p=AAAA")
    with pytest.raises(InvalidPassword):
        server.final(b"c=biws,r=xS,p=" + base64.b64encode(b"short"))


def test_verifier_round_trip_and_no_keys_in_repr() -> None:
    text = make_verifier("pw")
    verifier = parse_verifier(text)
    assert str(verifier) == text and "Key" not in repr(verifier)
    with pytest.raises(ValueError):
        parse_verifier("SCRAM-SHA-256$4096:!!!$a:b")


def test_scramp_rejects_what_libpq_sends_which_is_why_we_do_it_ourselves() -> None:
    from scramp import ScramMechanism

    server = ScramMechanism(MECHANISM).make_server(lambda user: None)
    with pytest.raises(ScramException):
        server.set_client_first("n,,n=,r=abc")
