"""The shape of a translation: groups, sensitivity, accuracy, and open-domain refusals."""

from __future__ import annotations

import pytest

from proxy.errors import DpproxyError
from sqlmap.accuracy import AccuracyDefaults, AccuracyRequest
from sqlmap.cube import BinKind, CategoricalDimension, Cube, NumericDimension
from sqlmap.translate import GroupValue, OutputKind, Translator

CUBE = Cube(
    "public",
    "people",
    (
        NumericDimension("age", (0, 18, 65, 120), integer=True),
        CategoricalDimension("sex", ("M", "F")),
        CategoricalDimension("kids", (0, 1, 2, 3)),  # numeric values, open
        CategoricalDimension("rooms", (1, 2, 3), closed=True, nullable=False),
    ),
)
T = Translator([CUBE])


def test_cells_and_shape() -> None:
    assert CUBE.shape == (6, 4, 6, 3)
    (row,) = T.translate("SELECT COUNT(*) FROM people").rows
    (q,) = row.queries
    assert q.cells.size == CUBE.n_cells and q.sensitivity == 1.0


def test_group_by_lists_every_bin_including_null_and_other() -> None:
    spec = T.translate("SELECT sex, COUNT(*) FROM people WHERE sex = 'M' GROUP BY sex")
    assert spec.group_dims == ("sex",)
    assert [r.keys for r in spec.rows] == [
        (GroupValue(BinKind.VALUE, "M"),),
        (GroupValue(BinKind.VALUE, "F"),),
        (GroupValue(BinKind.OTHER, None),),
        (GroupValue(BinKind.NULL, None),),
    ]
    # the filtered-out groups are still there, with an empty vector: rows never depend on data
    assert [r.queries[0].cells.size for r in spec.rows] == [CUBE.n_cells // 4, 0, 0, 0]


def test_groups_are_disjoint_and_cover_the_ungrouped_query() -> None:
    spec = T.translate("SELECT sex, rooms, COUNT(*) FROM people GROUP BY sex, rooms")
    assert len(spec.rows) == 4 * 3
    cells = [set(r.queries[0].cells.tolist()) for r in spec.rows]
    assert sum(len(c) for c in cells) == len(set().union(*cells)) == CUBE.n_cells


def test_sensitivity_is_max_abs_weight_and_ignores_constants() -> None:
    spec = T.translate(
        "SELECT 100 + SUM(CASE WHEN age < 18 THEN 2 WHEN sex = 'M' THEN -2.5 ELSE 1 END) "
        "FROM people"
    )
    (q,) = spec.rows[0].queries
    assert q.sensitivity == 2.5 and q.offset == 100.0


def test_linear_combination_adds_weights() -> None:
    spec = T.translate(
        "SELECT 1000 * COUNT(*) FILTER (WHERE age >= 65) "
        "+ 2000 * COUNT(*) FILTER (WHERE age >= 18) - 50000 FROM people"
    )
    (q,) = spec.rows[0].queries
    assert set(q.weights.tolist()) == {3000.0, 2000.0}
    assert q.sensitivity == 3000.0 and q.offset == -50000.0


def test_sum_of_closed_numeric_dimension() -> None:
    (q,) = T.translate("SELECT SUM(rooms * 10) FROM people").rows[0].queries
    assert set(q.weights.tolist()) == {10.0, 20.0, 30.0}


def test_accuracy_clause_and_defaults() -> None:
    assert T.translate("SELECT COUNT(*) FROM people").accuracy is None
    spec = T.translate("SELECT COUNT(*) FROM people WITH ACCURACY 25 CONFIDENCE 0.95")
    assert spec.accuracy == AccuracyRequest(25, 0.95)
    with_defaults = Translator([CUBE], AccuracyDefaults(10, 0.8))
    assert with_defaults.translate("SELECT COUNT(*) FROM people").accuracy == AccuracyRequest(
        10, 0.8
    )
    assert with_defaults.translate(
        "SELECT COUNT(*) FROM people WITH ACCURACY 3"
    ).accuracy == AccuracyRequest(3, 0.8)
    assert T.translate(
        "SELECT COUNT(*) FROM people with accuracy .5 confidence .99;"
    ).accuracy == AccuracyRequest(0.5, 0.99)


def test_clause_words_inside_strings_and_comments_are_not_the_clause() -> None:
    spec = T.translate(
        "SELECT COUNT(*) /* WITH ACCURACY 1 CONFIDENCE 0.5 */ FROM people -- WITH ACCURACY 2\n"
        "WHERE 'WITH ACCURACY 3 CONFIDENCE 0.5' <> 'x' OR sex IS NULL"
    )
    assert spec.accuracy is None


@pytest.mark.parametrize(
    ("sql", "sqlstate", "message"),
    [
        (
            "SELECT COUNT(*) FROM people WHERE sex = 'X'",
            "0A000",
            "'X' is not a declared value of sex",
        ),
        (
            "SELECT COUNT(*) FROM people WHERE sex IN ('M', 'X')",
            "0A000",
            "'X' is not a declared value of sex",
        ),
        (
            "SELECT COUNT(*) FROM people WHERE kids < 2",
            "0A000",
            "kids < 2 is undetermined for values of kids outside its declared list",
        ),
        (
            "SELECT COUNT(*) FROM people WHERE kids = 7",
            "0A000",
            "'7' is not a declared value of kids",
        ),
        (
            "SELECT SUM(kids) FROM people",
            "0A000",
            "the value of kids is unknown for rows outside its declared values",
        ),
        (
            "SELECT kids, COUNT(*) FROM people GROUP BY kids, age",
            "0A000",
            "GROUP BY age: a binned dimension has no single value per group",
        ),
        (
            "SELECT COUNT(*) FROM people WHERE age = 20",
            "0A000",
            "condition age = 20 splits the bin [18, 65) of age",
        ),
        (
            "SELECT COUNT(*) FROM people WHERE age < 150",
            "0A000",
            "condition age < 150 splits the bin >= 120 of age",
        ),
    ],
)
def test_open_domain_refusals(sql: str, sqlstate: str, message: str) -> None:
    with pytest.raises(DpproxyError) as raised:
        T.translate(sql)
    assert raised.value.sqlstate == sqlstate
    assert message in str(raised.value)


def test_closed_domain_decides_undeclared_values() -> None:
    # rooms is closed: 7 cannot occur, so the condition is simply false everywhere
    (q,) = T.translate("SELECT COUNT(*) FROM people WHERE rooms = 7").rows[0].queries
    assert q.cells.size == 0


def test_real_valued_bins_only_split_at_edges() -> None:
    real = Translator([Cube("public", "t", (NumericDimension("x", (0.0, 0.5, 1.0)),))])
    real.translate("SELECT COUNT(*) FROM t WHERE x < 0.5 OR x >= 1")
    with pytest.raises(DpproxyError, match=r"x <= 0.5 splits the bin \[0.5, 1\)"):
        real.translate("SELECT COUNT(*) FROM t WHERE x <= 0.5")


def test_session_defaults_replace_the_translators() -> None:
    with_defaults = Translator([CUBE], AccuracyDefaults(10, 0.8))
    session = AccuracyDefaults(None, 0.99)
    assert with_defaults.translate("SELECT COUNT(*) FROM people", session).accuracy is None
    assert with_defaults.translate(
        "SELECT COUNT(*) FROM people WITH ACCURACY 2", session
    ).accuracy == AccuracyRequest(2, 0.99)


def test_interval_columns_point_at_their_aggregate() -> None:
    spec = T.translate(
        "SELECT dp_interval_low(COUNT(*)) AS lo, sex, COUNT(*), SUM(rooms), "
        "DP_INTERVAL_HIGH(SUM(rooms)) FROM people GROUP BY sex"
    )
    kinds = [(c.name, c.kind, c.aggregate) for c in spec.columns]
    assert kinds == [
        ("lo", OutputKind.INTERVAL_LOW, 0),
        ("sex", OutputKind.GROUP_KEY, None),
        ("count", OutputKind.AGGREGATE, None),
        ("sum", OutputKind.AGGREGATE, None),
        ("dp_interval_high", OutputKind.INTERVAL_HIGH, 1),
    ]
    assert all(len(r.queries) == 2 for r in spec.rows)  # intervals add no queries


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        (
            "SELECT DP_INTERVAL_LOW(COUNT(*)) FROM people",
            "needs its aggregate in the select list too",
        ),
        (
            "SELECT COUNT(*), DP_INTERVAL_LOW(COUNT(*), 1) FROM people",
            "DP_INTERVAL_LOW takes one aggregate expression",
        ),
    ],
)
def test_bad_interval_columns(sql: str, message: str) -> None:
    with pytest.raises(DpproxyError, match=message):
        T.translate(sql)


def test_confidence_alone_in_the_clause() -> None:
    with_defaults = Translator([CUBE], AccuracyDefaults(10, 0.8))
    spec = with_defaults.translate("SELECT COUNT(*) FROM people WITH CONFIDENCE 0.99")
    assert spec.accuracy == AccuracyRequest(10, 0.99)
    assert T.translate("SELECT COUNT(*) FROM people with confidence .9;").accuracy is None
    # a CTE named confidence is not the clause
    tree = Translator.parse("WITH confidence AS (SELECT 1) SELECT * FROM confidence")
    assert with_defaults.defaults.resolve(tree) == AccuracyRequest(10, 0.8)


def test_dollar_quoted_constants() -> None:
    plain = T.translate("SELECT COUNT(*) FROM people WHERE sex = 'F'").rows[0].queries[0]
    for quoted in ("$$F$$", "$q$F$q$"):
        (q,) = T.translate(f"SELECT COUNT(*) FROM people WHERE sex = {quoted}").rows[0].queries
        assert q.cells.tolist() == plain.cells.tolist()


def test_an_undeclared_value_of_a_closed_dimension_is_answered_with_a_warning() -> None:
    closed = Cube(
        "public", "adult", (CategoricalDimension("sex", ("Male", "Female"), closed=True),)
    )
    translator = Translator([closed])
    spec = translator.translate("SELECT COUNT(*) FROM adult WHERE sex = 'Femal'")
    (q,) = spec.rows[0].queries
    assert q.cells.size == 0  # answered as written: no row holds 'Femal'
    assert spec.warnings == (
        "'Femal' is not a declared value of sex, which is closed: no row holds it; "
        "did you mean 'Female'?",
    )
    assert translator.translate("SELECT COUNT(*) FROM adult WHERE sex = 'Male'").warnings == ()
    (warning,) = T.translate("SELECT COUNT(*) FROM people WHERE rooms <> 7").warnings
    assert warning.startswith("'7' is not a declared value of rooms") and "declares '1', '2'" in (
        warning
    )
