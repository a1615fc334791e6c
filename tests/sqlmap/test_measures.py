"""Sums of measures: the translation, applied to the true coordinates (cell counts and clamped
sums), equals PostgreSQL's answer to the same SQL with every summed measure clamped, i.e.
``SUM(LEAST(GREATEST(col, lower), upper))``, exactly, on the real Adult table.

Hand-written queries over the demo cube come from tests/fixtures/sqlmap/exact_measures.sql;
hypothesis generates more over a cube whose bounds clamp many rows at both ends.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from proxy.errors import DomainViolation
from sqlmap.canonical import (
    COLUMN_TYPES_SQL,
    check_column_types,
    histogram_from_rows,
    histogram_sql,
    measurement_sql,
)
from sqlmap.cube import CategoricalDimension, Cube, Measure, cube_from_config
from sqlmap.errors import ConfigError, UndefinedColumn, UnsupportedQuery
from sqlmap.translate import Translator

from .corpus import read_corpus
from .exactness import assert_exact, true_histogram
from .test_exact import DEMO_CUBE, OPEN_CUBE, predicates, select_statement
from .test_measurement import assert_same

#: The open cube with measures whose bounds clamp: ages below 25 and above 60, hours below 10
#: and above 60, gains above 5000, weights outside [50000, 300000]
CLAMPED_CUBE = Cube(
    OPEN_CUBE.schema,
    OPEN_CUBE.table,
    OPEN_CUBE.dimensions,
    measures=(
        Measure("age", 25, 60),
        Measure("hours_per_week", 10, 60, nullable=False),
        Measure("capital_gain", 0, 5000),
        Measure("fnlwgt", 50000, 300000),
    ),
)
CUBES = {"demo": DEMO_CUBE, "clamped": CLAMPED_CUBE}
CASES = read_corpus("exact_measures.sql")


@pytest.fixture(scope="module")
def conn(adult_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(adult_dsn, autocommit=True) as c:
        yield c


@pytest.fixture(scope="module")
def coordinates(conn: psycopg.Connection) -> dict[str, npt.NDArray[np.int64]]:
    return {name: true_histogram(conn, cube) for name, cube in CUBES.items()}


def clamped(sql: str, cube: Cube) -> str:
    """The query as PostgreSQL must run it: every measure a SUM adds up clamped to its bounds.

    Only where a measure is a value being summed: conditions (WHERE, FILTER, CASE WHEN) compare
    the column itself, as dpproxy's dimensions do.
    """
    statement = Translator.parse(sql)

    def clamp(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column):
            index = cube.measure(node.name)
            if index is None:
                return node
            m = cube.measures[index]
            low = exp.func("GREATEST", node.copy(), exp.Literal.number(m.lower))
            return exp.func("LEAST", low, exp.Literal.number(m.upper))
        if isinstance(node, exp.Case):
            for branch in node.args["ifs"]:
                branch.set("true", clamp(branch.args["true"]))
            if node.args.get("default") is not None:
                node.set("default", clamp(node.args["default"]))
        elif isinstance(node, (exp.Add, exp.Sub, exp.Mul)):
            node.set("this", clamp(node.this))
            node.set("expression", clamp(node.expression))
        elif isinstance(node, (exp.Neg, exp.Paren)):
            node.set("this", clamp(node.this))
        return node

    for total in list(statement.find_all(exp.Sum)):
        total.set("this", clamp(total.this))
    return statement.sql("postgres")


def test_clamping_is_what_postgresql_computes(conn: psycopg.Connection) -> None:
    """The sums dpproxy measures are PostgreSQL's own clamped sums, cell by cell."""
    x = true_histogram(conn, CLAMPED_CUBE)
    n = CLAMPED_CUBE.n_cells
    expected = conn.execute(
        "SELECT count(*), sum(least(greatest(age, 25), 60)), "
        "sum(least(greatest(hours_per_week, 10), 60)), sum(least(greatest(capital_gain, 0), 5000)),"
        " sum(least(greatest(fnlwgt, 50000), 300000)) FROM adult"
    ).fetchone()
    assert expected is not None
    assert [int(x[k * n : (k + 1) * n].sum()) for k in range(5)] == [int(v) for v in expected]
    raw = conn.execute("SELECT sum(capital_gain), sum(age) FROM adult").fetchone()
    assert raw is not None and raw[0] > expected[3] and raw[1] != expected[1]  # bounds bite


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_corpus_sum_is_exact(
    conn: psycopg.Connection, coordinates: dict[str, npt.NDArray[np.int64]], case: object
) -> None:
    sql = case.sql  # type: ignore[attr-defined]
    spec = Translator([DEMO_CUBE]).translate(sql)
    assert any(q.cells.max(initial=-1) >= DEMO_CUBE.n_cells for q in spec.queries) or (
        "FALSE" in sql or "age < 17" in sql
    ), "the corpus is about sums of measures"
    assert_exact(conn, spec, clamped(sql, DEMO_CUBE), coordinates["demo"])


def test_the_corpus_is_measured_through_the_reader_sql(
    conn: psycopg.Connection, coordinates: dict[str, npt.NDArray[np.int64]]
) -> None:
    """The privileged SQL gives each corpus query's true answer as the coordinates do."""
    translator = Translator([DEMO_CUBE])
    for case in CASES:
        queries = [
            type(q)(q.n_cells, q.cells, q.weights, measures=q.measures)  # offset-free
            for q in translator.translate(case.sql).queries
        ]
        assert_same(conn, DEMO_CUBE, queries, coordinates["demo"])


measures = st.sampled_from(
    [
        "age",
        "hours_per_week",
        "capital_gain",
        "fnlwgt",
        "age - 30",
        "2 * hours_per_week",
        "capital_gain - 0.5 * age",
        "education_num * hours_per_week",
        "hours_per_week * (education_num - 8)",
        "-fnlwgt",
        "(capital_gain + 1) * 0.25",
    ]
)
values = st.one_of(measures, st.sampled_from(["1", "0", "education_num", "NULL"]))
sums = st.one_of(
    st.builds(lambda m: f"SUM({m})", measures),
    st.builds(lambda m, p: f"SUM({m}) FILTER (WHERE {p})", measures, predicates),
    st.builds(
        lambda p1, v1, p2, v2, v0: (
            f"SUM(CASE WHEN {p1} THEN {v1} WHEN {p2} THEN {v2} ELSE {v0} END)"
        ),
        predicates,
        values,
        predicates,
        values,
        measures,
    ),
)
items = st.one_of(
    sums,
    st.builds(lambda a, k, b: f"{a} + {k} * {b}", sums, st.sampled_from(["1", "-2", "0.5"]), sums),
    st.builds(lambda a, k: f"{a} - {k} * COUNT(*)", sums, st.sampled_from(["1", "40", "0.5"])),
)


@st.composite
def queries(draw: st.DrawFn) -> str:
    return select_statement(draw, items)


@settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(sql=queries())
def test_generated_sum_is_exact(
    conn: psycopg.Connection, coordinates: dict[str, npt.NDArray[np.int64]], sql: str
) -> None:
    spec = Translator([CLAMPED_CUBE]).translate(sql)
    assert_exact(conn, spec, clamped(sql, CLAMPED_CUBE), coordinates["clamped"])


def test_sensitivity_is_the_most_one_row_moves_the_answer() -> None:
    translator = Translator([DEMO_CUBE])

    def sensitivity(sql: str) -> float:
        return max(q.sensitivity for q in translator.translate(sql).queries)

    assert sensitivity("SELECT SUM(capital_gain) FROM adult") == 20000
    assert sensitivity("SELECT SUM(age) FROM adult") == 90  # nulls: never, so 17..90
    assert sensitivity("SELECT SUM(hours_per_week) FROM adult") == 99  # a NULL adds 0
    assert sensitivity("SELECT SUM(hours_per_week) - 40 * COUNT(*) FROM adult") == 59
    assert sensitivity("SELECT SUM(hours_per_week - 40) FROM adult") == 59
    assert sensitivity("SELECT SUM(capital_gain - capital_loss) FROM adult") == 20000
    assert sensitivity("SELECT SUM(capital_gain + capital_loss) FROM adult") == 25000
    assert sensitivity("SELECT SUM(age) - 100 * COUNT(*) FROM adult") == 83
    assert sensitivity("SELECT sex, SUM(capital_gain) FROM adult GROUP BY sex") == 20000


def test_refusals_point_to_measures() -> None:
    translator = Translator([DEMO_CUBE])
    with pytest.raises(UndefinedColumn) as undeclared:
        translator.translate("SELECT SUM(fnlwgt) FROM adult")
    assert "measure" in (undeclared.value.hint or "")
    with pytest.raises(UndefinedColumn, match="is a measure .* summed, not compared"):
        translator.translate("SELECT COUNT(*) FROM adult WHERE capital_loss > 0")
    with pytest.raises(UnsupportedQuery, match="product of two measures"):
        translator.translate("SELECT SUM(capital_gain * hours_per_week) FROM adult")
    binned = Translator([OPEN_CUBE])  # age is only a dimension there
    with pytest.raises(UnsupportedQuery) as inside:
        binned.translate("SELECT SUM(age) FROM adult")
    assert "measure" in (inside.value.hint or "")


def test_null_adds_zero_and_a_promise_of_no_null_is_checked(adult_dsn: str) -> None:
    """On a table of its own: NULLs add 0 (``nulls: zero``), and break ``nulls: never``."""
    dims = (CategoricalDimension("g", ("a", "b"), closed=True, nullable=False),)
    zero = Cube("public", "m_nulls", dims, measures=(Measure("v", 5, 10),))
    never = Cube("public", "m_nulls", dims, measures=(Measure("v", 5, 10, nullable=False),))
    with psycopg.connect(adult_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS m_nulls")
        conn.execute("CREATE TABLE m_nulls (g text, v integer)")
        conn.execute("INSERT INTO m_nulls VALUES ('a', 1), ('a', NULL), ('a', 7), ('b', 99)")
        x = histogram_from_rows(zero, conn.execute(histogram_sql(zero)).fetchall())
        assert x.tolist() == [3, 1, 5 + 0 + 7, 10]
        spec = Translator([zero]).translate("SELECT g, SUM(v), SUM(v + 1) FROM m_nulls GROUP BY g")
        m = measurement_sql(zero, list(spec.queries))
        assert m.answers(conn.execute(m.sql).fetchall()) == [12.0, 15.0, 10.0, 11.0]
        with pytest.raises(DomainViolation):
            histogram_from_rows(never, conn.execute(histogram_sql(never)).fetchall())
        spec = Translator([never]).translate("SELECT SUM(v) FROM m_nulls WHERE g = 'a'")
        m = measurement_sql(never, list(spec.queries))
        with pytest.raises(DomainViolation):  # the NULL lies in the cell read
            m.answers(conn.execute(m.sql).fetchall())
        spec = Translator([never]).translate("SELECT SUM(v) FROM m_nulls WHERE g = 'b'")
        m = measurement_sql(never, list(spec.queries))
        assert m.answers(conn.execute(m.sql).fetchall()) == [10.0]  # no row read breaks it
        conn.execute("DROP TABLE m_nulls")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([0, 10], "expected a mapping with 'lower' and 'upper'"),
        ({"lower": 0}, "missing 'upper'"),
        ({"lower": 0, "upper": 1.5}, "upper: expected an integer"),
        ({"lower": "0", "upper": 10}, "lower: expected an integer"),
        ({"lower": 10, "upper": 10}, "lower \\(10\\) must be below upper \\(10\\)"),
        ({"lower": 0, "upper": 10, "nulls": "skip"}, "nulls: expected 'zero'"),
        ({"lower": 0, "upper": 10, "clamp": True}, "unknown key 'clamp'"),
        ({"lower": 0, "upper": 2**40}, "bounds must lie within"),
    ],
)
def test_bad_measures_are_refused_with_their_key(spec: object, message: str) -> None:
    config = {"dimensions": {"sex": {"values": ["Male", "Female"]}}, "measures": {"gain": spec}}
    with pytest.raises(ConfigError, match=message) as refused:
        cube_from_config("adult", config, "tables.adult", 1.0)
    assert "tables.adult.measures.gain" in refused.value.message


def test_measures_are_checked_against_the_backend(conn: psycopg.Connection) -> None:
    types = dict(
        conn.execute(
            COLUMN_TYPES_SQL.replace("$1", "%s").replace("$2", "%s"), ("public", "adult")
        ).fetchall()
    )
    check_column_types(CLAMPED_CUBE, types)
    dims = OPEN_CUBE.dimensions
    for measure, message in (
        (Measure("income", 0, 1), "integer column, not one of type text"),
        (Measure("no_such", 0, 1), "has no column 'no_such'"),
    ):
        with pytest.raises(ConfigError, match=message):
            check_column_types(Cube("public", "adult", dims, measures=(measure,)), types)


def test_bounds_are_part_of_the_fingerprint() -> None:
    """History over old bounds would be charged wrongly: a change needs a rekey."""
    plain = Cube("public", "adult", OPEN_CUBE.dimensions)
    assert plain.fingerprint == OPEN_CUBE.fingerprint  # no measures: as before measures existed
    wider = Cube("public", "adult", OPEN_CUBE.dimensions, measures=(Measure("age", 25, 61),))
    narrower = Cube("public", "adult", OPEN_CUBE.dimensions, measures=(Measure("age", 25, 60),))
    assert len({plain.fingerprint, wider.fingerprint, narrower.fingerprint}) == 3
