"""DP_PROBABILITY and dp.estimate through the wire (psycopg, simple and extended protocol)."""

from __future__ import annotations

import psycopg
import pytest

from tests.e2e.conftest import Proxy

FEW = (
    "SELECT COUNT(*) AS n, DP_INTERVAL_LOW(COUNT(*)) AS lo, DP_PROBABILITY(COUNT(*) > 5) AS p "
    "FROM adult WHERE race = 'Amer-Indian-Eskimo' AND education = 'Doctorate' "
    "WITH ACCURACY 50"
)


def test_probability_and_the_estimate_setting(proxy: Proxy) -> None:
    with psycopg.connect(proxy.dsn(), autocommit=True, connect_timeout=10) as conn:
        assert conn.execute("SHOW dp.estimate").fetchone() == ("range",)
        ((n, lo, p),) = conn.execute(FEW).fetchall()  # 3 rows in truth: near 0 at +-50
        assert n >= 0 and lo >= 0 and 0.0 <= p <= 1.0
        conn.execute("SET dp.estimate = unbiased")
        ((raw, raw_lo, raw_p),) = conn.execute(FEW).fetchall()  # from history: free
        # the symmetric interval, uncut: the repeat's width, to the float rounding of the
        # history estimate's weight on the row (1 only to ~1e-16)
        assert 49 < raw - raw_lo <= 50 * (1 + 1e-12)
        assert n == pytest.approx(max(raw, 0.0), abs=1e-9) and raw_p == pytest.approx(p)
        conn.execute("RESET dp.estimate")
        ranked = conn.execute(
            "SELECT sex, DP_PROBABILITY(COUNT(*) >= 10000) AS p FROM adult GROUP BY sex "
            "ORDER BY p, sex WITH ACCURACY 100",
            prepare=True,
        ).fetchall()
    # 10,771 and 21,790 rows, at +-100: both all but certain, then ordered by sex
    assert [sex for sex, _ in ranked] == ["Female", "Male"]
    assert all(1 - 1e-6 < p <= 1.0 for _, p in ranked)
