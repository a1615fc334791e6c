"""Vectors applied to the true histogram equal PostgreSQL's answer to the same SQL, exactly.

Two cubes over the real Adult table: the shipped demo cube (config.yaml, closed domains) and an
"open" cube with NULL bins, undeclared values, values outside the edges and real-valued bins.
Hand-written queries come from tests/fixtures/sqlmap/exact_*.sql; hypothesis adds generated ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.config import load_config
from proxy.demo import ADULT_ROWS
from sqlmap.cube import CategoricalDimension, Cube, NumericDimension
from sqlmap.translate import Translator

from .corpus import read_corpus
from .exactness import assert_exact, true_histogram

ROOT = Path(__file__).parent.parent.parent

OPEN_CUBE = Cube(
    "public",
    "adult",
    (
        NumericDimension("age", (20, 30, 40, 50, 60)),  # real-valued bins, open at both ends
        CategoricalDimension(
            "workclass", ("Private", "Self-emp-not-inc", "Local-gov", "State-gov")
        ),
        CategoricalDimension("education_num", tuple(range(1, 17)), closed=True, nullable=False),
        CategoricalDimension("race", ("White", "Black")),
        NumericDimension("hours_per_week", (float("-inf"), 40, 41, float("inf")), integer=True),
    ),
)
DEMO_CUBE = load_config(ROOT / "config.yaml").cubes[0]


@pytest.fixture(scope="module")
def conn(adult_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(adult_dsn, autocommit=True) as c:
        yield c


@pytest.fixture(scope="module")
def histograms(conn: psycopg.Connection) -> dict[str, npt.NDArray[np.int64]]:
    return {"demo": true_histogram(conn, DEMO_CUBE), "open": true_histogram(conn, OPEN_CUBE)}


CUBES = {"demo": DEMO_CUBE, "open": OPEN_CUBE}
CASES = [("demo", c) for c in read_corpus("exact_demo.sql")] + [
    ("open", c) for c in read_corpus("exact_open.sql")
]


def test_histogram_counts_every_row(histograms: dict[str, npt.NDArray[np.int64]]) -> None:
    for name, x in histograms.items():
        assert x[: CUBES[name].n_cells].sum() == ADULT_ROWS


@pytest.mark.parametrize(("cube", "case"), CASES, ids=[c.id for _, c in CASES])
def test_corpus_query_is_exact(
    conn: psycopg.Connection, histograms: dict[str, npt.NDArray[np.int64]], cube: str, case: object
) -> None:
    spec = Translator([CUBES[cube]]).translate(case.sql)  # type: ignore[attr-defined]
    assert_exact(conn, spec, case.sql, histograms[cube])  # type: ignore[attr-defined]


# -- generated queries over the open cube ---------------------------------------------------

WORKCLASS = OPEN_CUBE.dimensions[1].values  # type: ignore[union-attr]


def _quoted(values: tuple[object, ...]) -> str:
    return ", ".join(f"'{v}'" if isinstance(v, str) else str(v) for v in values)


atoms = st.one_of(
    st.sampled_from(
        ["age < 20", "age >= 30", "age < 60", "50 <= age", "40 > age", "age IS NULL", "age >= 60"]
    ),
    st.builds(
        lambda op, v: f"workclass {op} '{v}'",
        st.sampled_from(["=", "<>"]),
        st.sampled_from(WORKCLASS),
    ),
    st.builds(
        lambda neg, vs: f"workclass {'NOT ' if neg else ''}IN ({_quoted(tuple(vs))})",
        st.booleans(),
        st.lists(st.sampled_from(WORKCLASS), min_size=1, max_size=3),
    ),
    st.sampled_from(
        [
            "workclass IS NULL",
            "workclass IS NOT NULL",
            "race = 'Black'",
            "race <> 'White'",
            "race IS NULL",
        ]
    ),
    st.builds(
        lambda op, v: f"education_num {op} {v}",
        st.sampled_from(["=", "<>", "<", "<=", ">", ">="]),
        st.integers(0, 17),
    ),
    st.builds(
        lambda a, b: f"education_num BETWEEN {min(a, b)} AND {max(a, b)}",
        st.integers(1, 16),
        st.integers(1, 16),
    ),
    st.sampled_from(  # integer bins (-inf, 39], [40, 40], [41, inf): constants at their edges
        [
            f"hours_per_week {op} {v}"
            for op, vs in {
                "<": (40, 41, 40.5),
                "<=": (39, 40, 40.5),
                ">": (39, 40, 40.5),
                ">=": (40, 41, 40.5),
                "=": (40, 40.5),
                "<>": (40, 40.5),
            }.items()
            for v in vs
        ]
    ),
)


def _combine(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.builds(lambda a, b: f"({a} AND {b})", children, children),
        st.builds(lambda a, b: f"({a} OR {b})", children, children),
        st.builds(lambda a: f"NOT ({a})", children),
    )


predicates = st.recursive(atoms, _combine, max_leaves=5)

weights = st.sampled_from(["1", "2", "-1", "0.5", "education_num", "2 * education_num - 1"])
branch_weights = st.one_of(weights, st.just("NULL"))  # a CASE needs one typed branch, like ELSE
aggregates = st.one_of(
    st.just("COUNT(*)"),
    st.sampled_from(["COUNT(workclass)", "COUNT(age)", "COUNT(race)", "SUM(education_num)"]),
    st.builds(lambda p: f"COUNT(*) FILTER (WHERE {p})", predicates),
    st.builds(lambda w, p: f"SUM({w}) FILTER (WHERE {p})", weights, predicates),
    st.builds(
        lambda p1, w1, p2, w2, w0: (
            f"SUM(CASE WHEN {p1} THEN {w1} WHEN {p2} THEN {w2} ELSE {w0} END)"
        ),
        predicates,
        branch_weights,
        predicates,
        branch_weights,
        weights,
    ),
)
linear = st.builds(
    lambda k1, a1, k2, a2, c: f"{k1} * {a1} + {k2} * {a2} - {c}",
    st.sampled_from(["1", "3", "-2", "0.25"]),
    aggregates,
    st.sampled_from(["1", "-1", "1000"]),
    aggregates,
    st.integers(0, 50000),
)


def select_statement(draw: st.DrawFn, items: st.SearchStrategy[str]) -> str:
    """A SELECT of 1-3 ``items`` from adult, maybe filtered, maybe grouped by 1-2 dimensions."""
    group = draw(
        st.lists(st.sampled_from(["workclass", "race", "education_num"]), max_size=2, unique=True)
    )
    select = ", ".join(group + draw(st.lists(items, min_size=1, max_size=3)))
    where = draw(st.one_of(st.none(), predicates))
    sql = f"SELECT {select} FROM adult"
    if where:
        sql += f" WHERE {where}"
    if group:
        sql += f" GROUP BY {', '.join(group)}"
    return sql


@st.composite
def queries(draw: st.DrawFn) -> str:
    return select_statement(draw, st.one_of(aggregates, linear))


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(sql=queries())
def test_generated_query_is_exact(
    conn: psycopg.Connection, histograms: dict[str, npt.NDArray[np.int64]], sql: str
) -> None:
    spec = Translator([OPEN_CUBE]).translate(sql)
    assert_exact(conn, spec, sql, histograms["open"])
