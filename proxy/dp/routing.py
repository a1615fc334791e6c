"""Decides, before anything runs, where each statement of a query string goes.

Every statement is one of:

* a DP query on a protected table: answered by the engine; only SQL generated from the cube ever
  reaches the backend, under the privileged role;
* a ``SET`` / ``RESET`` / ``SHOW`` of a ``dp.*`` setting: handled by the proxy;
* anything else that mentions a protected table: refused with 42501;
* everything else: relayed to PostgreSQL under the pass-through role, in the analyst database,
  which has no rights on protected tables, so PostgreSQL itself refuses what this inspector
  might miss. Statistics pass through too: there the protected tables are empty stand-ins
  (``pg_class.reltuples`` -1), the statistics views are revoked or shadowed by views of no rows,
  and the statistics functions revoked (`proxy.storage.provision`).

The inspector errs on the side of refusing: a statement that names a protected table as an
identifier anywhere (subqueries, CTEs, EXPLAIN, COPY, PREPARE, ...) is not passed through, and
the post-processing of a DP query may not name a statistics relation, column or function. Code
that would run under the pass-through role out of the inspector's sight (``DO``,
``CREATE FUNCTION``) is refused outright.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokenizer_core import Token, TokenType

from proxy.dp.settings import SettingCommand, Verb
from proxy.errors import DpproxyError, InsufficientPrivilege, SqlSyntaxError
from sqlmap.accuracy import DPPostgres
from sqlmap.cube import Cube
from sqlmap.postprocess import Wrapped, needs_wrapper, split
from sqlmap.translate import SUPPORTED_FORMS, Translator

__all__ = ["Route", "Statement", "split_statements", "Router", "STATISTICS_NAMES"]

_DIALECT = DPPostgres()


class Route(Enum):
    """Where a statement goes."""

    DP = "dp"
    SETTING = "setting"  # SET / RESET / SHOW of a dp.* setting
    PASSTHROUGH = "passthrough"


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement of a query string and its route.

    ``start`` is its offset in the query string, for error positions. ``parsed`` is the sqlglot
    tree of a DP query (with its accuracy clause); ``setting`` is the command of a dp.*
    SET/RESET/SHOW. ``wrapped`` is set for a DP query with post-processing around its cores
    (ORDER BY, LIMIT, HAVING, outer queries, a cursor, ...): the cores are answered, then the
    wrapper runs under the pass-through role (`sqlmap.postprocess`).
    """

    text: str
    start: int
    route: Route
    parsed: exp.Expr | None = None
    setting: SettingCommand | None = None
    wrapped: Wrapped | None = None
    #: ``EXPLAIN <DP query>``: say how it would be answered and what it would cost, spend nothing
    explain: bool = False
    #: ``RESET ALL`` / ``DISCARD ALL`` (poolers and tools reset sessions so): passed through, and
    #: once PostgreSQL has run it the session's dp.* settings are their startup values again
    resets_settings: bool = False


#: Catalog relations, columns and functions that reveal how many rows a table has (or their
#: values): a DP query's post-processing may not name them.
STATISTICS_NAMES = frozenset(
    {
        "reltuples",
        "relpages",
        "relallvisible",
        "pg_stats",
        "pg_stats_ext",
        "pg_stats_ext_exprs",
        "pg_statistic",
        "pg_statistic_ext_data",
        "pg_stat_all_tables",
        "pg_stat_user_tables",
        "pg_stat_sys_tables",
        "pg_stat_xact_all_tables",
        "pg_stat_xact_user_tables",
        "pg_stat_xact_sys_tables",
        "pg_statio_all_tables",
        "pg_statio_user_tables",
        "pg_statio_sys_tables",
        "pg_stat_all_indexes",
        "pg_stat_user_indexes",
        "pg_statio_all_indexes",
        "pg_statio_user_indexes",
        "pg_relation_size",
        "pg_total_relation_size",
        "pg_table_size",
        "pg_indexes_size",
        "pg_column_size",
        "pg_stat_file",
        "pg_read_file",
        "pg_read_binary_file",
        "pg_ls_dir",
    }
)
_STATISTICS_PREFIXES = ("pg_stat_get_",)

_STRING_TOKENS = {
    TokenType.STRING,
    TokenType.HEREDOC_STRING,
    TokenType.BYTE_STRING,
    TokenType.NATIONAL_STRING,
    TokenType.RAW_STRING,
    TokenType.HEX_STRING,
    TokenType.BIT_STRING,
    TokenType.UNICODE_STRING,
}


def split_statements(sql: str) -> list[tuple[int, str]]:
    r"""Split a query string at its top-level semicolons into (offset, text) pairs.

    Semicolons inside strings, quoted identifiers, comments and dollar-quoted bodies do not split.
    Empty statements are dropped.

    >>> split_statements("SELECT 1; SELECT ';' -- ;\n; ")
    [(0, 'SELECT 1'), (9, " SELECT ';' -- ;\n")]
    """
    return [(offset, text) for offset, text, _ in _pieces(sql)]


def _pieces(sql: str) -> list[tuple[int, str, list[Token] | None]]:
    """:func:`split_statements`, with the tokens of a statement sent alone, without a semicolon.

    Those are the string's own tokens (the common case), parsed as they are. The pieces of a
    longer string get None and tokenize again on their own, so that token positions are
    always the statement's.
    """
    try:
        tokens = _DIALECT.tokenize(sql)
    except TokenError:
        return [(0, sql, None)] if sql.strip() else []
    if tokens and all(t.token_type != TokenType.SEMICOLON for t in tokens):
        return [(0, sql, tokens)]
    pieces, start = [], 0
    for token in tokens:
        if token.token_type == TokenType.SEMICOLON:
            pieces.append((start, sql[start : token.start]))
            start = token.end + 1
    pieces.append((start, sql[start:]))
    return [(offset, text, None) for offset, text in pieces if _has_content(text)]


def _has_content(text: str) -> bool:
    try:
        return bool(_DIALECT.tokenize(text))
    except TokenError:
        return bool(text.strip())


def _decode_unicode_identifier(text: str, escape: str = "\\") -> str:
    r"""Decode the body of a ``U&"..."`` identifier (``\XXXX`` and ``\+XXXXXX`` escapes).

    >>> _decode_unicode_identifier(r"\0061dult")
    'adult'
    """
    out, i = [], 0
    while i < len(text):
        if text[i] == escape and text[i + 1 : i + 2] == escape:
            out.append(escape)
            i += 2
        elif text[i] == escape and text[i + 1 : i + 2] == "+":
            out.append(chr(int(text[i + 2 : i + 8], 16)))
            i += 8
        elif text[i] == escape:
            out.append(chr(int(text[i + 1 : i + 5], 16)))
            i += 5
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _any_of(words: Iterable[str], whole_words: Iterable[str] = ()) -> str:
    r"""A regex that finds any of ``words`` anywhere, or of ``whole_words`` as whole words.

    Written as a trie (shared prefixes factored out, every branch starting with a literal
    character), which Python's re searches several times faster than the flat alternation
    ``a|b|\bc\b``: `Router.plainly_passthrough` runs it on every relayed query.

    >>> _any_of(["pg_stats_ext", "pg_stats", "u&"], whole_words=["do"])
    '(?:do(?<=\\bdo)\\b|pg_stats|u\\&)'
    >>> [bool(re.search(_any_of(["dp"], ["do"]), t)) for t in ("undo", "do 1", "x.dp")]
    [False, True, True]
    """
    trie: dict[str, Any] = {}  # char -> subtrie; "" -> the end of a word: True if whole only
    for word, whole in [(w, False) for w in words] + [(w, True) for w in whole_words]:
        if not word:
            raise ValueError("empty word")
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = node.get("", True) and whole

    def emit(node: dict[str, Any], prefix: str) -> str:
        whole = node.get("")
        if whole is False:  # found anywhere: longer words starting with this one add nothing
            return ""
        parts = [re.escape(c) + emit(child, prefix + c) for c, child in sorted(node.items()) if c]
        if whole:
            parts.insert(0, rf"(?<=\b{re.escape(prefix)})\b")
        if not parts:
            return "(?!)"  # no words: never matches
        return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"

    return emit(trie, "")


class Router:
    """Routes statements for one proxy: its protected cubes and translator."""

    def __init__(self, translator: Translator, cubes: Iterable[Cube]) -> None:
        self.translator = translator
        self.tables = {c.table for c in cubes}
        self._words = re.compile(
            r"\b(" + "|".join(re.escape(t) for t in sorted(self.tables)) + r")\b", re.IGNORECASE
        )
        # Everything that can make a statement other than PASSTHROUGH, as plain substrings
        # (a superset of what route() looks for): see plainly_passthrough.
        self._suspicious = re.compile(  # matched against the lower-cased text
            _any_of(
                [t.lower() for t in self.tables] + ["u&", "dp", "create"],
                whole_words=["do", "role", "user", "authorization", "reset", "discard"],
            )
        )

    def plainly_passthrough(self, sql: str) -> bool:
        """True when every statement of ``sql`` certainly routes to PASSTHROUGH.

        A fast check for the common case, without tokenizing: the text names no protected
        table, even as a substring, has no ``U&`` identifier, no ``dp`` setting, no
        ``DO``/``CREATE``, no role change and no ``RESET``/``DISCARD``. False means only
        "ask :meth:`route`".

        >>> from sqlmap.cube import cube_from_config
        >>> cube = cube_from_config("adult", {"dimensions": {"age": {"bins": [0, 1]}}}, "t", 1.0)
        >>> router = Router(Translator([cube]), [cube])
        >>> router.plainly_passthrough("SELECT abalance FROM pgbench_accounts WHERE aid = 7")
        True
        >>> router.plainly_passthrough('SELECT * FROM "ADULT"')
        False
        >>> router.plainly_passthrough("SHOW dp.accuracy")
        False
        """
        return self._suspicious.search(sql.lower()) is None

    def route(self, sql: str) -> list[Statement]:
        """Route every statement of ``sql``; raise the first refusal, before anything runs."""
        return [self._route_one(offset, text, tokens) for offset, text, tokens in _pieces(sql)]

    def _route_one(self, offset: int, text: str, known: list[Token] | None = None) -> Statement:
        """Route one statement; ``known``: its tokens, if the caller has them."""
        tokens = known if known is not None else _tokens_or_none(text)
        setting = _dp_setting(tokens) if tokens else None
        if setting is not None:
            return Statement(text, offset, Route.SETTING, setting=setting)
        code = (_server_side_code(tokens) or _role_change(tokens)) if tokens else None
        if code is not None:
            raise InsufficientPrivilege(
                f"permission denied: {code} is not allowed through dpproxy",
                position=offset + len(text) - len(text.lstrip()),
            )
        table = self._protected_name(text, tokens)
        if table is None:
            # statistics too: PostgreSQL shows the analyst database's, where protected tables
            # are empty stand-ins and the statistics views are revoked or shadowed (provision)
            resets = bool(tokens) and _resets_all(tokens or [])
            return Statement(text, offset, Route.PASSTHROUGH, resets_settings=resets)
        statistics = _statistics_name(text)
        if tokens and tokens[0].text.upper() == "EXPLAIN":
            preview = self._explained(text, offset, tokens)
            if preview is not None:
                return preview
        if tokens is not None:
            parsed = self._dp_query(text, offset, tokens)
            if parsed is not None and not needs_wrapper(parsed):
                return Statement(text, offset, Route.DP, parsed=parsed)
            # a DP query's post-processing has no business with statistics: keep them apart
            wrapped = self._wrapped(text, tokens, parsed) if statistics is None else None
            if wrapped is not None:
                return Statement(text, offset, Route.DP, parsed=wrapped[0], wrapped=wrapped[1])
        if tokens:
            _refuse_unknown_command(tokens, offset)
        raise InsufficientPrivilege(
            f"permission denied: {table} is a protected table, readable only through DP aggregates",
            hint=SUPPORTED_FORMS,
            position=offset + (self._first_mention(text) or 0),
        )

    def _protected_name(self, text: str, tokens: list[Token] | None) -> str | None:
        """The protected table this statement mentions anywhere, if any."""
        if tokens is None:  # unreadable by the tokenizer: fall back to the raw text
            match = self._words.search(text)
            return match.group(1) if match else None
        for i, token in enumerate(tokens):
            if (
                token.token_type == TokenType.STRING
                and i
                and tokens[i - 1].token_type == TokenType.COMMAND
            ):
                # sqlglot keeps the rest of a statement it does not parse (EXPLAIN, PREPARE,
                # DECLARE, ...) as one string: inspect it as SQL
                inner = self._protected_name(token.text, _tokens_or_none(token.text))
                if inner is not None:
                    return inner
                continue
            if token.token_type == TokenType.IDENTIFIER:
                unicode = (
                    i >= 2
                    and tokens[i - 1].token_type == TokenType.AMP
                    and tokens[i - 2].text.upper() == "U"
                )
                name = _decode_unicode_identifier(token.text) if unicode else token.text
            elif token.token_type in _STRING_TOKENS:
                # a name in a string is data, e.g. psql's \d adult looks the table up by name;
                # a string run as SQL (query_to_xml, ...) runs under the pass-through role
                continue
            else:
                name = token.text.lower()
            if name in self.tables:
                return name
        return None

    def _explained(self, text: str, offset: int, tokens: list[Token]) -> Statement | None:
        """``EXPLAIN <DP query>`` as a preview of its plan; None for anything else.

        EXPLAIN ANALYZE (or with options) of a DP query is not a preview: it is refused as a
        read of the protected table, as is EXPLAIN of a query that is not a DP query.
        """
        start = tokens[0].end + 1  # the tokenizer keeps the rest of a command as one string
        body = text[start:]
        rest = _tokens_or_none(body)
        if not rest or rest[0].token_type == TokenType.L_PAREN:
            return None
        if rest[0].text.upper() in ("ANALYZE", "ANALYSE", "VERBOSE"):
            return None
        parsed = self._dp_query(body, offset + start)
        if parsed is not None and not needs_wrapper(parsed):
            return Statement(text, offset, Route.DP, parsed=parsed, explain=True)
        wrapped = self._wrapped(body, rest, parsed) if _statistics_name(body) is None else None
        if wrapped is None:
            return None
        return Statement(
            text, offset, Route.DP, parsed=wrapped[0], wrapped=wrapped[1], explain=True
        )

    def _wrapped(
        self, text: str, tokens: list[Token], parsed: exp.Expr | None
    ) -> tuple[exp.Expr, Wrapped] | None:
        """The statement and its split if it is DP cores with post-processing, else None.

        ``DECLARE name ... CURSOR ... FOR <query>`` declares a cursor over the query's wrapper:
        FETCH, MOVE and CLOSE then pass through. ``parsed`` is the statement if already parsed.
        """
        prefix = ""
        body = text
        if tokens[0].text.upper() == "DECLARE":
            start = tokens[0].end + 1  # the tokenizer keeps the rest of a command as one string
            rest = _tokens_or_none(text[start:]) or []
            words = [t.text.upper() for t in rest]
            if "CURSOR" not in words or "FOR" not in words[words.index("CURSOR") :]:
                return None
            end = start + rest[words.index("FOR", words.index("CURSOR"))].end + 1
            prefix, body = text[:end] + " ", text[end:]
        try:
            parsed = Translator.parse(body) if parsed is None or prefix else parsed
        except (DpproxyError, ParseError):
            return None
        if not isinstance(parsed, exp.Query):  # only queries: no INSERT, UPDATE, CREATE ... AS
            return None
        try:
            wrapped = split(parsed, self.translator, prefix)
        except DpproxyError as e:
            if e.position is not None:
                e.position += len(text) - len(body)
            raise
        return None if wrapped is None else (parsed, wrapped)

    def _first_mention(self, text: str) -> int | None:
        match = self._words.search(text)
        return match.start() if match else None

    def _dp_query(
        self, text: str, offset: int, tokens: list[Token] | None = None
    ) -> exp.Expr | None:
        """The parsed statement if it is meant as a DP query, else None.

        A DP query is a plain SELECT of aggregates from one table; anything else that mentions a
        protected table is refused by the caller. ``tokens``: ``text``'s, if known.
        """
        try:
            parsed = Translator.parse(text, tokens)
        except SqlSyntaxError as e:
            if not _looks_like_aggregate_query(text):
                return None
            position = None if e.position is None else offset + e.position
            raise SqlSyntaxError(e.message, hint=e.hint, position=position) from None
        except (DpproxyError, ParseError):
            return None
        if (
            not isinstance(parsed, exp.Select)
            or parsed.args.get("with_")
            or parsed.args.get("joins")
        ):
            return None
        source = parsed.args.get("from_")
        if source is None or not isinstance(source.this, exp.Table):
            return None
        if any(
            isinstance(n, (exp.Subquery, exp.Window))
            or (isinstance(n, exp.Select) and n is not parsed)
            for n in parsed.walk()
        ):
            return None
        if not any(isinstance(n, exp.AggFunc) for n in parsed.walk()):
            return None
        return parsed


#: The words a PostgreSQL statement can begin with (gram.y's stmt rules); anything else is a
#: syntax error there, which PostgreSQL reports before it looks at any table.
_COMMAND_WORDS = frozenset(
    """ABORT ALTER ANALYSE ANALYZE BEGIN CALL CHECKPOINT CLOSE CLUSTER COMMENT COMMIT COPY CREATE
    DEALLOCATE DECLARE DELETE DISCARD DO DROP END EXECUTE EXPLAIN FETCH GRANT IMPORT INSERT
    LISTEN LOAD LOCK MERGE MOVE NOTIFY PREPARE REASSIGN REFRESH REINDEX RELEASE RESET REVOKE
    ROLLBACK SAVEPOINT SECURITY SELECT SET SHOW START TABLE TRUNCATE UNLISTEN UPDATE VACUUM
    VALUES WITH""".split()
)


def _refuse_unknown_command(tokens: list[Token], offset: int) -> None:
    """A statement whose first word no PostgreSQL command starts with is a syntax error (42601).

    A typo such as ``SELEC COUNT(*) FROM adult`` then reads as PostgreSQL would report it, not
    as a read of the protected table.
    """
    first = tokens[0]
    if first.token_type == TokenType.L_PAREN or first.text.upper() in _COMMAND_WORDS:
        return
    raise SqlSyntaxError(f'syntax error at or near "{first.text}"', position=offset + first.start)


def _looks_like_aggregate_query(text: str) -> bool:
    """A SELECT that calls COUNT or SUM: a DP query with a typo rather than anything else."""
    tokens = _tokens_or_none(text) or []
    words = [t.text.upper() for t in tokens]
    return bool(words) and words[0] == "SELECT" and any(w in ("COUNT", "SUM") for w in words)


def _tokens_or_none(text: str) -> list[Token] | None:
    try:
        return _DIALECT.tokenize(text)
    except TokenError:
        return None


def _dp_setting(tokens: list[Token]) -> SettingCommand | None:
    """The command ``SET [SESSION] dp.x {=|TO} v``, ``RESET dp.x`` or ``SHOW dp.x``."""
    words = [t for t in tokens if t.token_type != TokenType.SEMICOLON]
    if not words:
        return None
    verb = words[0].text.upper()
    if (
        verb in ("SHOW", "RESET")
        and len(words) == 2
        and words[1].token_type in (TokenType.STRING, TokenType.VAR)
    ):
        name = words[1].text.strip().lower()  # sqlglot reads SHOW x and RESET x as command + string
        return SettingCommand(Verb(verb), name) if name.startswith("dp.") else None
    if verb not in ("SET", "RESET"):
        return None
    rest = words[1:]
    if verb == "SET" and rest and rest[0].text.upper() in ("SESSION", "LOCAL"):
        rest = rest[1:]
    if len(rest) < 3 or rest[0].text.lower() != "dp" or rest[1].token_type != TokenType.DOT:
        return None
    name = "dp." + rest[2].text.lower()
    if verb == "RESET":
        return SettingCommand(Verb.RESET, name) if len(rest) == 3 else None
    if len(rest) < 5 or not (rest[3].token_type == TokenType.EQ or rest[3].text.upper() == "TO"):
        return None
    value = "".join(t.text for t in rest[4:])
    return SettingCommand(Verb.SET, name, None if value.upper() == "DEFAULT" else value)


# A trie (see _any_of): the plain alternation took 0.4 s on a 1 MB statement, holding the GIL.
_STATISTICS_WORDS = re.compile(_any_of(_STATISTICS_PREFIXES, whole_words=STATISTICS_NAMES))
_WORD_REST = re.compile(r"\w*")


def _statistics_name(text: str) -> str | None:
    """A statistics relation, column or function named anywhere, strings and bodies included.

    >>> _statistics_name("SELECT U&pg_stat_get_live_tuples(1), n_live_tup FROM pg_stats")
    'pg_stat_get_live_tuples'
    """
    lower = text.lower()  # searched faster than with re.IGNORECASE
    match = _STATISTICS_WORDS.search(lower)
    if match is None:
        return None
    rest = _WORD_REST.match(lower, match.end())
    return match.group(0) + (rest.group(0) if rest else "")


def _resets_all(tokens: list[Token]) -> bool:
    """``RESET ALL`` or ``DISCARD ALL``, which reset every setting, dp.* ones included."""
    words = [t.text.upper() for t in tokens if t.token_type != TokenType.SEMICOLON]
    return words in (["RESET", "ALL"], ["DISCARD", "ALL"])


def _server_side_code(tokens: list[Token]) -> str | None:
    """The kind of server-side code a statement would create or run, if any.

    ``DO`` blocks and new functions run code as the pass-through role that could assemble names
    at run time, out of the inspector's sight; analysts have no need for them.
    """
    words = [t.text.upper() for t in tokens[:4]]
    if words[:1] == ["DO"]:
        return "DO"
    if words[:1] == ["CREATE"]:
        rest = words[3:4] if words[1:3] == ["OR", "REPLACE"] else words[1:2]
        if rest and rest[0] in (
            "FUNCTION",
            "PROCEDURE",
            "AGGREGATE",
            "LANGUAGE",
            "EXTENSION",
            "RULE",
            "TRIGGER",
        ):
            return f"CREATE {rest[0]}"
    return None


def _role_change(tokens: list[Token]) -> str | None:
    """``ALTER ROLE``/``USER``/``GROUP``, ``SET ROLE`` or ``SET SESSION AUTHORIZATION``, if so.

    A second line only: each analyst's pass-through role is their own (PostgreSQL lets a role
    change its own settings and password, which then affects that analyst alone), and it may
    not become another role (docs/deploy.md).
    """
    words = [t.text.upper() for t in tokens[:5]]
    if words[:1] == ["ALTER"] and words[1:2] in (["ROLE"], ["USER"], ["GROUP"]):
        return f"ALTER {words[1]}"
    if words[:1] != ["SET"]:
        return None
    rest = words[1:]
    if rest[:1] in (["SESSION"], ["LOCAL"]) and rest[1:2] != ["AUTHORIZATION"]:
        rest = rest[1:]
    if rest[:1] == ["ROLE"]:
        return "SET ROLE"
    if rest[:2] == ["SESSION", "AUTHORIZATION"]:
        return "SET SESSION AUTHORIZATION"
    return None
