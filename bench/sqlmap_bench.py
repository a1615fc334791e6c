"""CPU of sqlmap's share of a statement on the demo cube: translation, the factored vectors'
construction (as a restart rebuilds them from the ledger) and the reader's SQL.

The statements are bench/sql_workload.py's dashboard stream; each figure is the median over
``--repeats`` passes of CPU time (``time.process_time``) per statement or per distinct vector.

    uv run python -m bench.sqlmap_bench [--statements 600] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from bench.sql_workload import CUBE, machine, stream
from sqlmap.canonical import measurement_sql
from sqlmap.errors import DpproxyError
from sqlmap.translate import AnswerSpec, Translator
from sqlmap.vector import LinearQuery


def per_item_us(work: Callable[[], int], repeats: int) -> float:
    """Median over ``repeats`` passes of CPU microseconds per item (``work`` returns the count)."""
    work()  # warm: caches, imports
    figures = []
    for _ in range(repeats):
        started = time.process_time()
        items = work()
        figures.append((time.process_time() - started) / items * 1e6)
    return statistics.median(figures)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--statements", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)

    translator = Translator([CUBE])
    sqls = [s.sql for s in stream(args.statements)]
    specs: list[AnswerSpec] = []
    for sql in sqls:
        try:
            specs.append(translator.translate(sql))
        except DpproxyError:
            pass
    distinct = {q.key: q for spec in specs for q in spec.queries}
    tensors = []
    for q in distinct.values():
        assert q.core is not None and q.shape is not None
        spread = [q.kinds] + [n if d in q.axes else 1 for d, n in enumerate(q.shape)]
        tensors.append((q.shape, np.array(q.core.reshape(spread)), q.measures))
    batches = [[q.without_offset() for q in spec.queries] for spec in specs]

    def translate() -> int:
        for sql in sqls:
            try:
                translator.translate(sql)
            except DpproxyError:
                pass
        return len(sqls)

    def build() -> int:
        for shape, tensor, measures in tensors:
            LinearQuery.from_tensor(shape, tensor, measures=measures)
        return len(tensors)

    def reader_sql() -> int:
        for batch in batches:
            measurement_sql(CUBE, batch)
        return len(batches)

    print(f"# sqlmap on the demo cube ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n")
    print(machine())
    print("\n| step | items | CPU per item (us, median) |\n|---|---|---|")
    print(f"| translate | {len(sqls)} statements | {per_item_us(translate, args.repeats):.0f} |")
    print(
        f"| LinearQuery.from_tensor | {len(tensors)} distinct vectors "
        f"| {per_item_us(build, args.repeats):.0f} |"
    )
    print(
        f"| measurement_sql | {len(batches)} statements "
        f"| {per_item_us(reader_sql, args.repeats):.0f} |"
    )
    print(f"\nafter: {machine()}")


if __name__ == "__main__":
    main()
