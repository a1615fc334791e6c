"""Accuracy requests and the ``WITH ACCURACY <eps> CONFIDENCE <c>`` clause that carries them.

The clause is not SQL, so the dialect below lifts it off the end of the token stream before
PostgreSQL's grammar sees the statement. Working on tokens, not text, means a string literal or
a comment that happens to contain the words is never mistaken for the clause.

Tools that parse SQL themselves (Superset's SQL Lab, Metabase) reject the clause, but keep
comments: ``/* dp: accuracy=100 confidence=0.95 */`` anywhere in a statement is a *hint*. The
clause comes first, then the hint, then the session's ``dp.*`` settings, then config.yaml.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import ClassVar

from sqlglot import exp
from sqlglot.dialects.postgres import Postgres
from sqlglot.generators.postgres import PostgresGenerator
from sqlglot.parsers.postgres import PostgresParser
from sqlglot.tokenizer_core import Token, TokenType

from sqlmap.errors import InvalidParameterValue, SqlSyntaxError

__all__ = [
    "AccuracyRequest",
    "AccuracyDefaults",
    "AccuracyClause",
    "AccuracyHint",
    "DPPostgres",
    "CLAUSE_KEY",
    "HINT_KEY",
]

#: The key under which a parsed statement carries its :class:`AccuracyClause`.
CLAUSE_KEY = "dp_accuracy"
#: The key under which a parsed statement carries its :class:`AccuracyHint`.
HINT_KEY = "dp_hint"


@dataclass(frozen=True, slots=True)
class AccuracyRequest:
    """A requested accuracy: the truth is within +-eps of the answer with this confidence.

    >>> round(AccuracyRequest(25, 0.95).delta, 12)
    0.05
    >>> AccuracyRequest(0, 0.95)
    Traceback (most recent call last):
    ...
    sqlmap.errors.InvalidParameterValue: accuracy must be a positive number, got 0
    """

    eps: float
    confidence: float

    #: The smallest miss probability accepted: the engine computes error tails to about 1e-13,
    #: so a smaller delta could not be told apart from that error.
    MIN_DELTA: ClassVar[float] = 1e-9

    def __post_init__(self) -> None:
        if not (isinstance(self.eps, (int, float)) and math.isfinite(self.eps) and self.eps > 0):
            raise InvalidParameterValue(f"accuracy must be a positive number, got {self.eps!r}")
        if not (
            isinstance(self.confidence, (int, float))
            and math.isfinite(self.confidence)
            and 0 < self.confidence < 1
        ):
            raise InvalidParameterValue(
                f"confidence must lie strictly between 0 and 1, got {self.confidence!r}"
            )
        if self.confidence > 1 - self.MIN_DELTA:
            raise InvalidParameterValue(
                f"confidence above {1 - self.MIN_DELTA} cannot be guaranteed, "
                f"got {self.confidence!r}"
            )
        object.__setattr__(self, "eps", float(self.eps))
        object.__setattr__(self, "confidence", float(self.confidence))

    @property
    def delta(self) -> float:
        """The allowed failure probability, 1 - confidence."""
        return 1.0 - self.confidence

    def __str__(self) -> str:
        return f"±{self.eps:g} at {self.confidence:.6g} confidence"


class AccuracyClause(exp.Expression):
    """``WITH ACCURACY eps [CONFIDENCE c]`` or ``WITH CONFIDENCE c``, as written.

    Either part may be absent; the other comes from the hint, the settings or config.yaml.
    """

    arg_types = {"eps": False, "confidence": False}


class AccuracyHint(exp.Expression):
    """``/* dp: accuracy=eps confidence=c */``: either part may be absent."""

    arg_types = {"eps": False, "confidence": False}


_HINT_PARTS = (("accuracy", "eps"), ("confidence", "confidence"))
_HINT = re.compile(r"\s*dp\s*:(.*)", re.DOTALL | re.IGNORECASE)
_HINT_SETTING = re.compile(r"\s*(\w+)\s*=\s*([^\s,]+)\s*,?")


def _hint(tokens: list[Token]) -> AccuracyHint | None:
    """The statement's ``dp:`` comment, if any; more than one is a syntax error.

    >>> tokens = DPPostgres().tokenize("SELECT 1 /* dp: accuracy=5, confidence=.9 */")
    >>> _hint(tokens).sql(DPPostgres())
    '/* dp: accuracy=5.0 confidence=0.9 */'
    """
    found: list[tuple[Token, str]] = [
        (token, match.group(1))
        for token in tokens
        for comment in token.comments
        if (match := _HINT.fullmatch(comment)) is not None
    ]
    if not found:
        return None
    if len(found) > 1:
        raise SqlSyntaxError("only one /* dp: ... */ hint is allowed", position=found[1][0].start)
    token, body = found[0]
    hint = AccuracyHint()
    rest = body.strip()
    while rest:
        match = _HINT_SETTING.match(rest)
        key = match.group(1).lower() if match else None
        if match is None or key not in ("accuracy", "confidence"):
            raise SqlSyntaxError(
                f"unreadable dp hint: {body.strip()!r}",
                hint="write /* dp: accuracy=100 confidence=0.95 */",
                position=token.start,
            )
        try:
            value = float(match.group(2))
        except ValueError:
            raise SqlSyntaxError(
                f"{key} in the dp hint needs a number, got {match.group(2)!r}",
                position=token.start,
            ) from None
        hint.set("eps" if key == "accuracy" else "confidence", exp.Literal.number(value))
        rest = rest[match.end() :]
    return hint


class DPPostgres(Postgres):
    """PostgreSQL, plus a trailing accuracy clause on the last statement."""

    class Generator(PostgresGenerator):
        """Renders the clause for messages and logs; the statement itself never carries it."""

        TRANSFORMS = {
            **PostgresGenerator.TRANSFORMS,
            AccuracyClause: lambda self, e: " ".join(
                ["WITH"]
                + (["ACCURACY", self.sql(e, "eps")] if e.args.get("eps") else [])
                + (["CONFIDENCE", self.sql(e, "confidence")] if e.args.get("confidence") else [])
            ),
            AccuracyHint: lambda self, e: " ".join(
                ["/* dp:"]
                + [f"{k}={self.sql(e, a)}" for k, a in _HINT_PARTS if e.args.get(a)]
                + ["*/"]
            ),
        }

    class Parser(PostgresParser):
        """Lifts the accuracy clause off the tokens, parses the rest as PostgreSQL."""

        def parse(self, raw_tokens: list[Token], sql: str) -> list[exp.Expr | None]:
            """Parse ``sql`` into statements, the last one carrying its accuracy clause."""
            tokens, clause = _split_clause(raw_tokens, sql)
            hint = _hint(raw_tokens)
            statements = super().parse(tokens, sql)
            if clause is not None:
                if not statements or statements[-1] is None:
                    raise SqlSyntaxError(
                        "WITH ACCURACY must follow a query", position=raw_tokens[0].start
                    )
                statements[-1].set(CLAUSE_KEY, clause)
            if hint is not None and statements and statements[-1] is not None:
                statements[-1].set(HINT_KEY, hint)
            return statements


def _is_word(token: Token, word: str) -> bool:
    return token.token_type == TokenType.VAR and token.text.upper() == word


def _confidence_alone(tokens: list[Token], i: int) -> bool:
    """``CONFIDENCE <number>`` at ``i``: not a CTE that happens to be named confidence."""
    return (
        _is_word(tokens[i], "CONFIDENCE")
        and i + 1 < len(tokens)
        and tokens[i + 1].token_type in (TokenType.NUMBER, TokenType.DOT)
    )


def _split_clause(tokens: list[Token], sql: str) -> tuple[list[Token], AccuracyClause | None]:
    """Split ``tokens`` into the statement's tokens and its trailing accuracy clause.

    The clause is ``WITH ACCURACY <number> [CONFIDENCE <number>]`` or ``WITH CONFIDENCE
    <number>`` and may only be followed by a semicolon. It anywhere else is a syntax error that
    points at it.

    >>> sql = "SELECT 1 WITH CONFIDENCE 0.99"
    >>> _split_clause(DPPostgres().tokenize(sql), sql)[1].sql(DPPostgres())
    'WITH CONFIDENCE 0.99'
    """
    starts = [
        i
        for i in range(len(tokens) - 1)
        if tokens[i].token_type == TokenType.WITH
        and (_is_word(tokens[i + 1], "ACCURACY") or _confidence_alone(tokens, i + 1))
    ]
    if not starts:
        return tokens, None
    start = starts[-1]
    end = len(tokens)
    while end > start and tokens[end - 1].token_type == TokenType.SEMICOLON:
        end -= 1
    clause = tokens[start:end]
    if len(starts) > 1:
        raise SqlSyntaxError(
            "only one WITH ACCURACY clause is allowed, at the end", position=tokens[starts[0]].start
        )
    node = AccuracyClause()
    after = 1
    if _is_word(clause[1], "ACCURACY"):
        eps, after = _number(clause, 1, sql)
        node.set("eps", exp.Literal.number(eps))
    if after < len(clause) and _is_word(clause[after], "CONFIDENCE"):
        confidence, after = _number(clause, after, sql)
        node.set("confidence", exp.Literal.number(confidence))
    if after < len(clause):
        raise SqlSyntaxError(
            "unexpected text after the accuracy clause",
            hint="the clause must end the statement: ... WITH ACCURACY 25 CONFIDENCE 0.95",
            position=clause[after].start,
        )
    return tokens[:start] + tokens[end:], node


def _number(clause: list[Token], keyword: int, sql: str) -> tuple[float, int]:
    """The number after the keyword ``clause[keyword]``, and the index of the token after it.

    A number is one NUMBER token, optionally signed, or ``.`` NUMBER (``.95``) as in SQL.
    """
    word = clause[keyword].text.upper()
    i = keyword + 1
    if i < len(clause) and clause[i].token_type in (TokenType.DASH, TokenType.PLUS):
        i += 1
    if i < len(clause) and clause[i].token_type == TokenType.DOT:
        i += 1
    if i >= len(clause) or clause[i].token_type != TokenType.NUMBER:
        got = repr(clause[i].text) if i < len(clause) else "nothing"
        raise SqlSyntaxError(
            f"{word} needs a number, got {got}",
            hint="the clause reads: WITH ACCURACY 25 CONFIDENCE 0.95",
            position=clause[i].start if i < len(clause) else clause[keyword].end + 1,
        )
    text = sql[clause[keyword + 1].start : clause[i].end + 1]
    return float(text.replace(" ", "")), i + 1


@dataclass(frozen=True, slots=True)
class AccuracyDefaults:
    """What a query asks for when its clause is absent or gives no CONFIDENCE.

    Filled from config.yaml, then from the session's ``dp.accuracy`` / ``dp.confidence``.

    >>> AccuracyDefaults(10, 0.9).resolve(None)
    AccuracyRequest(eps=10.0, confidence=0.9)
    >>> AccuracyDefaults().resolve(None) is None
    True
    """

    accuracy: float | None = None
    confidence: float = 0.95

    def __post_init__(self) -> None:
        AccuracyRequest(self.accuracy if self.accuracy is not None else 1.0, self.confidence)

    def resolve(self, statement: exp.Expr | None) -> AccuracyRequest | None:
        """The statement's clause, then its hint, then these defaults; None if none gives eps.

        >>> from sqlmap.accuracy import DPPostgres
        >>> tree = DPPostgres().parse("SELECT 1 /* dp: confidence=0.9 */ WITH ACCURACY 3")[0]
        >>> AccuracyDefaults(10, 0.99).resolve(tree)
        AccuracyRequest(eps=3.0, confidence=0.9)
        """
        found = [
            statement.args.get(key) if statement is not None else None
            for key in (CLAUSE_KEY, HINT_KEY)
        ]

        def first(name: str, default: float | None) -> float | None:
            for node in found:
                value = node.args.get(name) if node is not None else None
                if value is not None:
                    return float(value.to_py())
            return default

        eps = first("eps", self.accuracy)
        confidence = first("confidence", self.confidence)
        assert confidence is not None
        return None if eps is None else AccuracyRequest(eps, confidence)
