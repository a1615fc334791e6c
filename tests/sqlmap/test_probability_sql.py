"""DP_PROBABILITY in the select list: which aggregate it reports on, which comparison it tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import load_config
from proxy.errors import DpproxyError
from sqlmap.probability import Comparison
from sqlmap.translate import OutputKind

T = load_config(Path(__file__).parent.parent.parent / "config.yaml").translator()


def test_probability_columns_point_at_their_aggregate_and_keep_the_comparison() -> None:
    spec = T.translate(
        "SELECT sex, COUNT(*), SUM(CASE WHEN income = '>50K' THEN 1 ELSE 0 END) AS s, "
        "DP_PROBABILITY(COUNT(*) > 100) AS p, dp_probability(-2.5 >= sum(case when income = "
        "'>50K' then 1 else 0 end)), DP_PROBABILITY(((COUNT(*)) BETWEEN 10 AND 2 * 10)) "
        "FROM adult GROUP BY sex WITH ACCURACY 50"
    )
    probabilities = [
        (c.name, c.aggregate, c.comparison)
        for c in spec.columns
        if c.kind is OutputKind.PROBABILITY
    ]
    assert probabilities == [
        ("p", 0, Comparison(">", 100.0)),
        ("dp_probability", 1, Comparison("<=", -2.5)),
        ("dp_probability", 0, Comparison("between", 10.0, 20.0)),
    ]
    assert all(len(r.queries) == 2 for r in spec.rows)  # no extra value, no extra budget


@pytest.mark.parametrize(
    ("sql", "sqlstate", "message"),
    [
        ("SELECT DP_PROBABILITY(COUNT(*) > 1) FROM adult", "0A000", "needs its aggregate"),
        ("SELECT COUNT(*), DP_PROBABILITY(COUNT(*)) FROM adult", "0A000", "not a comparison"),
        ("SELECT COUNT(*), DP_PROBABILITY(COUNT(*) = 3) FROM adult", "0A000", "not a comparison"),
        (
            "SELECT COUNT(*), DP_PROBABILITY(COUNT(*) NOT BETWEEN 1 AND 3) FROM adult",
            "0A000",
            "not a comparison",
        ),
        (
            "SELECT COUNT(*), DP_PROBABILITY(COUNT(*) > COUNT(*)) FROM adult",
            "0A000",
            "one aggregate expression with a constant",
        ),
        ("SELECT COUNT(*), DP_PROBABILITY(COUNT(*) > 'x') FROM adult", "42804", "a number"),
        (
            "SELECT COUNT(*), DP_PROBABILITY(COUNT(*) BETWEEN SYMMETRIC 3 AND 1) FROM adult",
            "0A000",
            "SYMMETRIC",
        ),
        ("SELECT COUNT(*), DP_PROBABILITY(COUNT(*) > 1, 2) FROM adult", "0A000", "one comparison"),
    ],
)
def test_bad_probability_columns(sql: str, sqlstate: str, message: str) -> None:
    with pytest.raises(DpproxyError, match=message) as raised:
        T.translate(sql + " WITH ACCURACY 10")
    assert raised.value.sqlstate == sqlstate
