"""Where statements go: DP engine, proxy settings, pass-through, or refusal (42501)."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import load_config
from proxy.dp.routing import Route, Router, split_statements
from proxy.dp.settings import SettingCommand, Verb
from proxy.errors import DpproxyError

CONFIG = load_config(Path(__file__).parent.parent / "config.yaml")
ROUTER = Router(CONFIG.translator(), CONFIG.cubes)


def routes(sql: str) -> list[Route]:
    return [s.route for s in ROUTER.route(sql)]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) FROM adult",
        "select count(*) from PUBLIC.Adult where sex = 'Male' with accuracy 5",
        'SELECT sex, COUNT(*) FROM "adult" GROUP BY sex',
        "SELECT AVG(age) FROM adult",  # meant as DP: the engine's translator explains the refusal
    ],
)
def test_dp_queries(sql: str) -> None:
    assert routes(sql) == [Route.DP]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1",
        "SELECT relname, relkind FROM pg_catalog.pg_class WHERE relname = 'adult'",
        "SELECT c.relname FROM pg_catalog.pg_class c "
        "WHERE c.relname OPERATOR(pg_catalog.~) '^(adult)$'",
        "SET search_path = public",
        "SHOW server_version",
        "BEGIN",
        "SELECT COUNT(*) FROM other_table",
        "CREATE TABLE notes (t text)",
        "SELECT 'adult'",
    ],
)
def test_pass_through(sql: str) -> None:
    assert routes(sql) == [Route.PASSTHROUGH]


@pytest.mark.parametrize(
    ("sql", "setting"),
    [
        ("SET dp.accuracy = 10", SettingCommand(Verb.SET, "dp.accuracy", "10")),
        ("set session DP.confidence to 0.9;", SettingCommand(Verb.SET, "dp.confidence", "0.9")),
        ("SET dp.accuracy TO DEFAULT", SettingCommand(Verb.SET, "dp.accuracy")),
        ("SET dp.accuracy = '12.5'", SettingCommand(Verb.SET, "dp.accuracy", "12.5")),
        ("RESET dp.accuracy", SettingCommand(Verb.RESET, "dp.accuracy")),
        ("SHOW dp.confidence", SettingCommand(Verb.SHOW, "dp.confidence")),
    ],
)
def test_dp_settings(sql: str, setting: SettingCommand) -> None:
    (statement,) = ROUTER.route(sql)
    assert statement.route is Route.SETTING and statement.setting == setting


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT * FROM adult", "adult is a protected table"),
        ("SELECT age FROM adult WHERE sex = 'Male'", "adult is a protected table"),
        ("SELECT COUNT(*) FROM (SELECT * FROM adult) t", "adult is a protected table"),
        ("WITH t AS (SELECT * FROM adult) SELECT COUNT(*) FROM t", "adult is a protected table"),
        ("SELECT COUNT(*) FROM adult UNION SELECT age FROM adult", "adult is a protected table"),
        ("SELECT COUNT(*) FROM adult a JOIN adult b ON true", "adult is a protected table"),
        ("SELECT COUNT(*) OVER () FROM adult", "adult is a protected table"),
        ("EXPLAIN SELECT * FROM adult", "adult is a protected table"),
        ("COPY adult TO STDOUT", "adult is a protected table"),
        ("PREPARE p AS SELECT COUNT(*) FROM adult", "adult is a protected table"),
        ("DECLARE c CURSOR FOR SELECT * FROM adult", "adult is a protected table"),
        ('SELECT * FROM U&"\\0061dult"', "adult is a protected table"),
        ("SELECT 1; SELECT * FROM adult", "adult is a protected table"),
        ("DO $$ BEGIN RAISE NOTICE 'x'; END $$", "DO is not allowed through dpproxy"),
        (
            "CREATE OR REPLACE FUNCTION f() RETURNS int AS 'SELECT 1' LANGUAGE sql",
            "CREATE FUNCTION is not allowed",
        ),
    ],
)
def test_refused_with_42501(sql: str, message: str) -> None:
    with pytest.raises(DpproxyError) as raised:
        ROUTER.route(sql)
    assert raised.value.sqlstate == "42501"
    assert message in str(raised.value)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT reltuples FROM pg_class WHERE relname = 'adult'",
        "SELECT c.* FROM pg_class c WHERE c.relname = 'adult'",
        "SELECT n_live_tup FROM pg_stat_user_tables",
        "SELECT pg_relation_size('public.adult')",
        "SELECT pg_stat_get_live_tuples('public.adult'::regclass)",
        "SELECT * FROM pg_stats WHERE tablename = 'adult'",
    ],
)
def test_statistics_are_left_to_postgresql(sql: str) -> None:
    """The analyst database's: stand-ins, revoked functions, views of no rows (test_probes)."""
    assert [s.route for s in ROUTER.route(sql)] == [Route.PASSTHROUGH]


def test_refusal_points_at_the_table_in_the_whole_query_string() -> None:
    sql = "SELECT 1; SELECT * FROM adult"
    with pytest.raises(DpproxyError) as raised:
        ROUTER.route(sql)
    assert raised.value.position == sql.index("adult")


def test_syntax_error_in_a_dp_query_keeps_its_position() -> None:
    sql = "SELECT 1;\nSELECT COUNT(* FROM adult"
    with pytest.raises(DpproxyError) as raised:
        ROUTER.route(sql)
    assert raised.value.sqlstate == "42601"


@pytest.mark.parametrize(
    ("sql", "first"),
    [
        ("SELEC COUNT(*) FROM adult", "SELEC"),
        ("SLECT * FROM adult", "SLECT"),
        ("COUNT(*) FROM adult", "COUNT"),
    ],
)
def test_a_typo_in_the_first_word_is_a_syntax_error(sql: str, first: str) -> None:
    with pytest.raises(DpproxyError) as raised:
        ROUTER.route("SELECT 1;  " + sql)
    assert raised.value.sqlstate == "42601"
    assert str(raised.value) == f'syntax error at or near "{first}"'
    assert raised.value.position == len("SELECT 1;  ")


def test_mixed_batch_keeps_order() -> None:
    assert routes("SELECT 1; SELECT COUNT(*) FROM adult; SET dp.accuracy = 3; SELECT 2") == [
        Route.PASSTHROUGH,
        Route.DP,
        Route.SETTING,
        Route.PASSTHROUGH,
    ]


def test_split_statements_respects_quotes_comments_and_dollar_bodies() -> None:
    sql = "SELECT ';'; /* ; */ SELECT $x$ ; $x$; SELECT \";\" -- ;\n;;"
    assert [t.strip() for _, t in split_statements(sql)] == [
        "SELECT ';'",
        "/* ; */ SELECT $x$ ; $x$",
        'SELECT ";" -- ;',
    ]


SAMPLES = [
    "SELECT 1",
    "SELECT abalance FROM pgbench_accounts WHERE aid = 7",
    "SELECT * FROM adult",
    'SELECT * FROM "ADULT"',
    'SELECT * FROM U&"\\0061dult"',
    "SET dp.accuracy = 3",
    "show DP.confidence",
    "DO $$ BEGIN END $$",
    "do $$ begin end $$",
    "CREATE FUNCTION f() RETURNS int AS 'SELECT 1' LANGUAGE sql",
    "SELECT reltuples FROM pg_class",
    "SELECT RELTUPLES FROM pg_class",
    "SELECT PG_STAT_GET_LIVE_TUPLES(1)",
    "SELECT 'x'; SELECT 1",
    "",
    "BEGIN; SELECT 1; COMMIT",
    "SELECT COUNT(*) FROM Adult WITH ACCURACY 3",
    "SELECT 1 /* adult */",
]


@pytest.mark.parametrize("sql", SAMPLES)
def test_plainly_passthrough_never_overrides_the_router(sql: str) -> None:
    if ROUTER.plainly_passthrough(sql):
        assert all(s.route is Route.PASSTHROUGH for s in ROUTER.route(sql))


def test_plainly_passthrough_recognizes_the_common_case() -> None:
    assert ROUTER.plainly_passthrough("SELECT abalance FROM pgbench_accounts WHERE aid = 7;")
    assert ROUTER.plainly_passthrough("BEGIN; UPDATE t SET x = 1; COMMIT")
    assert not ROUTER.plainly_passthrough(
        "SELECT 1 /* adult */"
    )  # merely cautious: route() decides


def test_explain_of_a_dp_query_is_a_preview() -> None:
    (plain,) = ROUTER.route("EXPLAIN SELECT COUNT(*) FROM adult WITH ACCURACY 5")
    assert plain.route is Route.DP and plain.explain and plain.wrapped is None
    (wrapped,) = ROUTER.route("explain SELECT sex, COUNT(*) FROM adult GROUP BY sex LIMIT 1")
    assert wrapped.explain and wrapped.wrapped is not None
    for refused in (
        "EXPLAIN ANALYZE SELECT COUNT(*) FROM adult",
        "EXPLAIN (COSTS OFF) SELECT COUNT(*) FROM adult",
        "EXPLAIN SELECT * FROM adult",
    ):
        with pytest.raises(DpproxyError) as raised:
            ROUTER.route(refused)
        assert raised.value.sqlstate == "42501", refused


ALONE_AND_IN_A_STRING = [
    "SELECT COUNT(*) FROM adult WHERE age >= 35 WITH ACCURACY 400",
    "SELECT sex, COUNT(*) FROM adult /* dp: confidence=0.9 */ GROUP BY sex WITH ACCURACY 5",
    "-- a panel\nSELECT SUM(CASE WHEN sex = 'Male' THEN 2 ELSE 1 END) FROM adult\n"
    "/* dp: accuracy=9 */",
    "SELECT COUNT(*) FROM adult ORDER BY 1 LIMIT 1 WITH ACCURACY 7",
    "EXPLAIN SELECT COUNT(*) FROM adult WITH ACCURACY 5",
    "DECLARE c CURSOR FOR SELECT sex, COUNT(*) FROM adult GROUP BY sex WITH ACCURACY 5",
    "SET dp.accuracy = 10",
    "SELECT 1",
    "SELECT * FROM adult",
    "SELECT COUNT(*) FROM adult WHERE WITH ACCURACY 5",
    "SELEC COUNT(*) FROM adult",
]


def _outcome(sql: str) -> tuple[object, ...]:
    """The first statement's route, tree (with comments), flags and split, or the refusal."""
    try:
        s = ROUTER.route(sql)[0]
    except DpproxyError as e:
        return ("refused", e.sqlstate, e.message, e.position)
    tree = None if s.parsed is None else (s.parsed.sql("postgres", comments=True), repr(s.parsed))
    wrapped = None if s.wrapped is None else repr(s.wrapped)
    return (s.route, s.text, tree, s.setting, s.explain, wrapped)


@pytest.mark.parametrize("sql", ALONE_AND_IN_A_STRING)
def test_a_statement_sent_alone_routes_as_in_a_longer_string(sql: str) -> None:
    """Alone, a statement is routed on the string's own tokens; followed by another, on the
    tokens of its piece: the route, tree, comments and refusals are the same."""
    assert _outcome(sql) == _outcome(sql + ";\nSELECT 1")


def test_a_statement_sent_alone_is_tokenized_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from sqlmap.accuracy import DPPostgres

    calls: list[str] = []
    tokenize = DPPostgres.tokenize

    def counted(self: DPPostgres, sql: str, dialect: object = None) -> list[object]:
        calls.append(sql)
        return tokenize(self, sql)

    monkeypatch.setattr(DPPostgres, "tokenize", counted)
    (statement,) = ROUTER.route(ALONE_AND_IN_A_STRING[0])
    assert statement.route is Route.DP
    assert calls == [ALONE_AND_IN_A_STRING[0]]
