"""BlockFronts against the span solver and a dense minimum-norm reference."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.component_elimination import history_and_tests
from bench.engine_sql_bench import cubes
from proxy.engine import fronts as fronts_module
from proxy.engine.factored import AnovaCoordinates
from proxy.engine.fronts import BlockFronts
from proxy.engine.span import SpanSolver
from sqlmap.vector import LinearQuery

RESIDUAL = 1e-6
Coordinates = tuple[np.ndarray, np.ndarray]


def _random_vector(rng: np.random.Generator, shape: tuple[int, ...]) -> LinearQuery:
    """A count over ranges of 1-3 dimensions, a GROUP BY's group, or a small-integer sum."""
    axes = sorted(rng.choice(len(shape), int(rng.integers(1, min(3, len(shape)) + 1)), False))
    factors = []
    for d, n in enumerate(shape):
        if d not in axes:
            factors.append(np.ones(n))
            continue
        kind = rng.random()
        if kind < 0.4:  # a range
            low = int(rng.integers(n))
            high = int(rng.integers(low, n)) + 1
            f = np.zeros(n)
            f[low:high] = 1.0
        elif kind < 0.8:  # a group
            f = np.zeros(n)
            f[int(rng.integers(n))] = 1.0
        else:  # lattice weights
            f = rng.integers(-2, 3, n).astype(float)
        factors.append(f)
    tensor = factors[0]
    for f in factors[1:]:
        tensor = np.multiply.outer(tensor, f)
    if not np.any(tensor):
        tensor.flat[0] = 1.0
    return LinearQuery.from_tensor(shape, tensor)


class _Both:
    """The same vectors and weights in BlockFronts, a SpanSolver and a dense matrix."""

    def __init__(self, space: AnovaCoordinates, n_cells: int) -> None:
        self.space = space
        self.n_cells = n_cells
        self.fronts = BlockFronts(space, residual=RESIDUAL)
        self.span = SpanSolver(n_cells, residual=RESIDUAL)
        self.vectors: list[Coordinates] = []
        self.weights2: list[float] = []

    def copy(self) -> _Both:
        other = _Both.__new__(_Both)
        other.__dict__.update(self.__dict__)
        other.fronts, other.span = self.fronts.copy(), self.span.copy()
        other.vectors, other.weights2 = list(self.vectors), list(self.weights2)
        return other

    def add(self, coordinates: Coordinates) -> int:
        j = self.fronts.add(*coordinates)
        assert self.span.add(*coordinates) == j == len(self.vectors)
        self.vectors.append(coordinates)
        self.weights2.append(0.0)
        return j

    def weigh(self, j: int, weight2: float) -> None:
        self.fronts.weigh(j, weight2)
        self.span.weigh(j, weight2)
        self.weights2[j] += weight2

    def dense(self) -> np.ndarray:
        out = np.zeros((len(self.vectors), self.n_cells))
        for i, (c, v) in enumerate(self.vectors):
            out[i, c] = v
        return out

    def check(self, queries: list[Coordinates]) -> int:
        """Solve ``queries`` three ways and compare; returns how many are inside the span."""
        found, residuals = self.fronts.solve_many(queries)
        span_found, span_residuals = self.span.solve_many(queries)
        assert self.fronts.rank == self.span.rank
        vectors = self.dense()
        c = np.sqrt(np.array(self.weights2))
        weighed = c[:, None] * vectors
        inverse = np.linalg.pinv(weighed.T, rcond=1e-10)
        inside = 0
        for (qc, qv), values, residual, span_values, span_residual in zip(
            queries, found, residuals, span_found, span_residuals
        ):
            q = np.zeros(self.n_cells)
            q[qc] = qv
            u = inverse @ q
            truth = np.linalg.norm(weighed.T @ u - q) / np.linalg.norm(q)
            assert (values is None) == (span_values is None) == (truth > RESIDUAL)
            if values is None:
                assert residual > RESIDUAL  # (past it, the rest of the bound is not summed)
                continue
            assert residual >= truth - 1e-9  # an upper bound
            inside += 1
            assert residual <= RESIDUAL and span_residual <= RESIDUAL
            assert values.shape == (len(self.vectors),)
            scale = np.abs(u).max()
            assert np.allclose(values * c, u, rtol=0.0, atol=1e-9 * scale)
            assert np.allclose(span_values * c, u, rtol=0.0, atol=1e-9 * scale)
        return inside


def _random_history_step(rng: np.random.Generator, both: _Both, shape: tuple[int, ...]) -> None:
    """Add a vector (new, repeated or scaled from an earlier one), weighed at once, or weigh."""
    action = rng.random()
    if action < 0.45 or not both.vectors:
        if both.vectors and rng.random() < 0.25:  # a multiple of an earlier vector
            c, v = both.vectors[int(rng.integers(len(both.vectors)))]
            coordinates = (c, float(rng.choice([-1.0, 2.0, 0.5])) * v)
        else:
            coordinates = both.space.of(_random_vector(rng, shape))
        j = both.add(coordinates)
    else:
        j = int(rng.integers(len(both.vectors)))
    both.weigh(j, float(rng.choice([0.04, 1.0, 25.0])))


def _queries(rng: np.random.Generator, both: _Both, shape: tuple[int, ...]) -> list[Coordinates]:
    """A GROUP BY-like batch: new vectors, history vectors and combinations of them."""
    out = []
    for _ in range(int(rng.integers(1, 6))):
        pick = rng.random()
        if pick < 0.3:
            c, v = both.vectors[int(rng.integers(len(both.vectors)))]
            out.append((c, v.copy()))
        elif pick < 0.55:  # a combination of history vectors
            q = np.zeros(both.n_cells)
            for i in rng.choice(len(both.vectors), min(3, len(both.vectors)), False):
                c, v = both.vectors[int(i)]
                q[c] += float(rng.integers(1, 4)) * v
            (c,) = np.nonzero(np.abs(q) > 1e-12)
            if c.size:
                out.append((c.astype(np.int64), q[c]))
        else:
            out.append(both.space.of(_random_vector(rng, shape)))
    return out


@pytest.mark.parametrize("seed", range(16))
def test_fronts_solve_as_the_span_solver_and_a_dense_reference(seed: int) -> None:
    """Adds, weighs, copies and solves interleaved on small random cubes."""
    rng = np.random.default_rng(seed)
    shape = tuple(int(n) for n in rng.integers(2, 5, int(rng.integers(2, 5))))
    space = AnovaCoordinates(shape)
    both = _Both(space, math.prod(n + 1 for n in shape))  # room for every block
    inside = solves = 0
    for step in range(60):
        _random_history_step(rng, both, shape)
        if step % 4 == 3:
            queries = _queries(rng, both, shape)
            inside += both.check(queries)
            solves += len(queries)
        if step % 20 == 19:  # a copy grows apart from its original
            copy = both.copy()
            for _ in range(5):
                _random_history_step(rng, copy, shape)
            copy.check(_queries(rng, copy, shape))
            both.check(_queries(rng, both, shape))
    assert 0 < inside < solves  # both kinds occur


def test_copies_are_independent() -> None:
    space = AnovaCoordinates((3, 2))
    fronts = BlockFronts(space, residual=RESIDUAL)
    a = space.of(LinearQuery.from_tensor((3, 2), np.array([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]])))
    b = space.of(LinearQuery.from_tensor((3, 2), np.array([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]])))
    fronts.weigh(fronts.add(*a), 1.0)
    other = fronts.copy()
    other.weigh(other.add(*b), 1.0)
    other.weigh(0, 3.0)
    assert (fronts.rank, fronts.size, other.rank, other.size) == (1, 1, 2, 2)
    assert fronts.solve_many([]) == ([], [])
    (outside,), _ = fronts.solve_many([b])
    (inside,), _ = other.solve_many([b])
    assert outside is None and inside is not None
    (alone,), _ = fronts.solve_many([a])  # the original's weight is still 1
    assert alone is not None and alone.tolist() == pytest.approx([1.0])


def test_a_wrong_carry_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison fails if the rows' remainders are not passed on."""
    monkeypatch.setattr(fronts_module, "_passed_on", lambda *args: [])
    with pytest.raises(AssertionError):
        for seed in range(4):
            test_fronts_solve_as_the_span_solver_and_a_dense_reference(seed)


def test_the_demo_cubes_history_solves_as_the_span_solver() -> None:
    """The history bench.engine_sql_bench loads (m = 600), pooled per distinct vector."""
    history, precisions, tests = history_and_tests("demo", 600, tests=20)
    space = AnovaCoordinates(cubes()["demo"].shape)
    coordinates = space.of_many(history + tests)
    both = _Both(space, space.size)
    for coordinate, precision in zip(coordinates[: len(history)], precisions):
        both.weigh(both.add(coordinate), float(precision))
    inside = both.check(coordinates[len(history) :])
    assert 0 < inside < len(tests)
    # one more row at a time: a repeat, then a new statement's vector (the plan's copy)
    copy = both.copy()
    copy.weigh(3, 0.5)
    copy.weigh(copy.add(coordinates[len(history)]), 0.25)
    copy.check(coordinates[len(history) :])
    assert both.check(coordinates[len(history) :]) == inside


def test_ranks_agree_with_the_span_solvers_one_vector_at_a_time() -> None:
    """Each vector's own decision, against _INDEPENDENT's, as vectors arrive one by one."""
    rng = np.random.default_rng(99)
    shape = (4, 3, 3, 2)
    space = AnovaCoordinates(shape)
    both = _Both(space, math.prod(n + 1 for n in shape))
    for _ in range(150):
        _random_history_step(rng, both, shape)
        assert both.fronts.rank == both.span.rank
    assert 10 < both.span.rank < len(both.vectors)


def test_a_restarts_fronts_solve_as_those_built_row_by_row() -> None:
    """Every row at once (a restart: each block takes its rows together) against one at a time."""
    history, precisions, tests = history_and_tests("demo", 600, tests=20)
    space = AnovaCoordinates(cubes()["demo"].shape)
    coordinates = space.of_many(history + tests)
    at_once = BlockFronts(space, residual=RESIDUAL)
    one_by_one = BlockFronts(space, residual=RESIDUAL)
    for coordinate, precision in zip(coordinates[: len(history)], precisions):
        at_once.weigh(at_once.add(*coordinate), float(precision))
        one_by_one.weigh(one_by_one.add(*coordinate), float(precision))
        _ = one_by_one.rank  # rotated in now
    assert at_once.rank == one_by_one.rank
    queries = coordinates[len(history) :]
    found, residuals = at_once.solve_many(queries)
    expected, expected_residuals = one_by_one.solve_many(queries)
    assert 0 < sum(values is not None for values in found) < len(queries)
    for values, wanted in zip(found, expected):
        assert (values is None) == (wanted is None)
        if values is not None:
            scale = np.abs(wanted).max()
            assert np.allclose(values, wanted, rtol=0.0, atol=1e-9 * scale)
    assert np.allclose(residuals, expected_residuals, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("seed", range(12))
def test_a_restarts_rows_of_precisions_far_apart_keep_the_historys_rank(seed: int) -> None:
    """Rows whose weights lie up to 1e6 apart, taken together (a restart): each later block
    judges the rows passed on to it against the scale of the blocks they came from, so their
    rounding does not become directions (it did: rank 43 for 26, weights 1e11 off the query)."""
    rng = np.random.default_rng(seed)
    shape = (4, 3, 5)
    space = AnovaCoordinates(shape)
    fronts = BlockFronts(space, residual=RESIDUAL)
    tensors, weights = [], []
    for _ in range(int(rng.integers(15, 40))):
        tensor = np.where(rng.random(60) < 0.3, rng.choice([1.0, 2.0, -1.0], 60), 0.0)
        if not tensor.any():
            continue
        tensors.append(tensor)
        weights.append(float(rng.choice([1e-4, 0.05, 3.0, 50.0, 100.0])) ** 2)
        cells = LinearQuery.from_tensor(shape, tensor.reshape(shape))
        fronts.weigh(fronts.add(*space.of(cells)), weights[-1])
    h = np.array(tensors)
    assert fronts.rank == np.linalg.matrix_rank(h)
    queries = [h[0] + h[-1], h[len(h) // 2], 2.0 * h[1] - h[2]]
    found, _ = fronts.solve_many(
        [space.of(LinearQuery.from_tensor(shape, q.reshape(shape))) for q in queries]
    )
    for values, query in zip(found, queries):
        assert values is not None
        # u_j = c_j * values_j, and sum_j u_j c_j h_j is the query: to eps times the squared
        # condition of the weighed rows (1e6 apart), as through the span solver's Gram route
        combined = (values * np.array(weights)) @ h
        assert np.abs(combined - query).max() <= 1e-2 * np.abs(query).max()


@pytest.mark.parametrize("seed", range(6))
def test_kept_back_substitution_products_extended_as_rebuilt(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``R_T^{-1} C_T V_S^T`` extended as a later front ``S`` gains directions, not rebuilt.

    Read by solves between the weighs (the products are kept), then compared with those built
    again from the fronts as they are, on the same ``y``.
    """
    extend = BlockFronts._compressed_extended
    extended = [0]

    def counted(fronts: BlockFronts, *args: object) -> None:
        before = dict(fronts._compressed)
        extend(fronts, *args)  # type: ignore[arg-type]
        extended[0] += sum(fronts._compressed[b] is not kept for b, kept in before.items())

    monkeypatch.setattr(BlockFronts, "_compressed_extended", counted)
    rng = np.random.default_rng(100 + seed)
    shape = tuple(int(n) for n in rng.integers(2, 5, 3))
    space = AnovaCoordinates(shape)
    both = _Both(space, math.prod(n + 1 for n in shape))
    for step in range(48):
        _random_history_step(rng, both, shape)
        if step % 3 == 2:
            both.check(_queries(rng, both, shape))
        fronts = both.fronts
        fronts._absorb()
        blocks = fronts._table()
        ranks = fronts._order()[1]
        for block, (front, reduced, positions, reads) in list(fronts._compressed.items()):
            if fronts._fronts.get(block) is not front:
                continue
            y = rng.standard_normal(blocks.size)
            del fronts._compressed[block]
            rebuilt, where, bits = fronts._compressed_below(blocks, block, ranks)
            assert bits == reads and sorted(where.tolist()) == sorted(positions.tolist())
            scale = np.abs(rebuilt).max(initial=0.0) * np.abs(y).max()
            assert np.allclose(reduced @ y[positions], rebuilt @ y[where], atol=1e-12 * scale)
    assert extended[0] > 0


@pytest.mark.parametrize("rows, width, rank", [(6, 20, 6), (6, 20, 4), (30, 8, 8), (30, 8, 5)])
def test_a_blocks_directions_and_its_rows_along_them(rows: int, width: int, rank: int) -> None:
    """``_directions`` (through the smaller side's QR): as many as the SVD finds past the
    threshold, orthonormal, and the rows along them give the rows back, each to rounding of
    its own norm (weights 1e6 apart) plus the threshold (the directions left out)."""
    rng = np.random.default_rng(rows * width + rank)
    off = rng.standard_normal((rows, rank)) @ rng.standard_normal((rank, width))
    off *= 10.0 ** rng.uniform(-6, 0, rows)[:, None]
    threshold = 1e-9 * np.linalg.norm(off, axis=1).max()
    directions, along = fronts_module._directions(off, threshold)
    singular = np.linalg.svd(off, compute_uv=False)
    assert directions.shape == (int(np.sum(singular > threshold)), width) == (rank, width)
    assert np.allclose(directions @ directions.T, np.eye(rank), rtol=0.0, atol=1e-13)
    error = np.linalg.norm(along @ directions - off, axis=1)
    assert np.all(error <= 1e-12 * np.linalg.norm(off, axis=1) + threshold)


def test_a_new_front_of_independent_rows_is_those_rows() -> None:
    """A block opened by fewer independent rows than its coordinates (most of a restart's)
    keeps them as its front, ``[R_T V_T | C_T]`` (``R_T`` triangular): not rotated, so its
    ``C_T`` is their parts over the later blocks themselves, and nothing is passed on."""
    rng = np.random.default_rng(5)
    shape = (4, 3, 5)
    space = AnovaCoordinates(shape)
    both = _Both(space, math.prod(n + 1 for n in shape))
    weights2 = [1e-6, 4.0, 1.0, 2500.0, 0.25]  # (not by norm: the front takes them so)
    for weight2 in weights2:
        tensor = rng.integers(1, 4, shape).astype(float)  # weighs every block
        both.weigh(both.add(space.of(LinearQuery.from_tensor(shape, tensor))), weight2)
    fronts = both.fronts
    assert fronts.rank == 5
    rows = np.zeros((5, space.size))
    for i, ((c, v), weight2) in enumerate(zip(both.vectors, weights2)):
        rows[i, c] = math.sqrt(weight2) * v
    blocks = fronts._table()
    (top,) = [b for b in fronts._fronts if len(blocks.keys[b]) == 4]  # (kind, 0, 1, 2)
    front = fronts._fronts[top]
    start, stop = blocks.bounds(top)
    assert stop - start > 5 and front.columns.size == space.size - (stop - start)
    # the front's rows: the given ones by increasing norm at the block
    order = np.argsort(-np.linalg.norm(rows[:, start:stop], axis=1), kind="stable")[::-1]
    assert np.array_equal(front.below, rows[order][:, front.columns])
    assert np.array_equal(front.factor, np.triu(front.factor))
    scale = np.abs(rows).max()
    here = front.factor @ front.directions
    assert np.allclose(here, rows[order, start:stop], rtol=0.0, atol=1e-13 * scale)
    assert len(fronts._fronts) == 1  # nothing passed on: the later blocks have no front
    both.check([space.of(LinearQuery.from_tensor(shape, rng.random(shape))) for _ in range(3)])


@pytest.mark.parametrize("runs", [1, 3, 40])
def test_rows_stacked_over_the_union_of_their_columns(runs: int) -> None:
    """``_stacked``: each row's entries at its columns, zero elsewhere, whether its columns
    are a few runs among the union's (copied as slices) or many (scattered)."""
    rng = np.random.default_rng(runs)
    size, incoming = 400, []
    for _ in range(5):
        starts = np.sort(rng.choice(np.arange(0, size, 8), runs, replace=False))
        columns = np.concatenate([np.arange(s, s + int(rng.integers(1, 8))) for s in starts])
        incoming.append((columns, rng.standard_normal((int(rng.integers(1, 4)), columns.size))))
    columns, rows = fronts_module._stacked(incoming, size)
    dense = np.zeros((rows.shape[0], size))
    first = 0
    for c, r in incoming:
        dense[first : first + r.shape[0], c] = r
        first += r.shape[0]
    assert np.array_equal(columns, np.flatnonzero(np.any(dense, axis=0)))
    assert np.array_equal(rows, dense[:, columns])


@pytest.mark.parametrize("seed", range(6))
def test_a_single_row_is_passed_on_as_among_many(seed: int) -> None:
    """``_passed_on`` of one row (a fresh value's): the block, columns and entries it gets
    grouped with a row absorbed to rounding (the path of many rows), its own rounding dropped."""
    rng = np.random.default_rng(seed)
    space = AnovaCoordinates((3, 2, 4))
    space.of(LinearQuery.from_tensor((3, 2, 4), rng.random((3, 2, 4))))  # (every block)
    blocks = fronts_module._Blocks(space)
    columns = np.sort(rng.choice(blocks.size, 25, replace=False)).astype(np.int64)
    row = rng.standard_normal((1, columns.size))
    row[0, rng.choice(columns.size, 8, replace=False)] = 1e-16  # rounding, some blocks' all
    expected = fronts_module._passed_on(blocks, columns, np.vstack([row, 1e-17 * row]), 1.0)
    ((block, (kept, rows)),) = fronts_module._passed_on(blocks, columns, row.copy(), 1.0)
    ((other, (other_kept, other_rows)),) = expected
    assert block == other and np.array_equal(kept, other_kept)
    assert np.array_equal(rows, other_rows[:1]) and rows.shape == (1, kept.size)
    assert fronts_module._passed_on(blocks, columns, 1e-16 * row, 1.0) == []


@pytest.mark.parametrize("seed", range(4))
def test_a_fronts_columns_below_are_rotated_row_major(seed: int) -> None:
    """A fold rotates ``[C_T; rows]`` as ``[C_T^T rows^T] Q`` (``dtpmqrt`` from the right): the
    fronts keep ``C_T`` row-major, where a reflector reads consecutive numbers, and solve as
    the span solver and the dense reference (checked every 4th step)."""
    rng = np.random.default_rng(700 + seed)
    shape = tuple(int(n) for n in rng.integers(2, 5, 3))
    both = _Both(AnovaCoordinates(shape), math.prod(n + 1 for n in shape))
    rotated = 0
    for step in range(32):
        _random_history_step(rng, both, shape)
        if step % 4 == 3:
            both.check(_queries(rng, both, shape))
        both.fronts._absorb()
        for front in both.fronts._fronts.values():
            if min(front.below.shape) > 1:  # (one row or column: both layouts at once)
                assert front.below.flags.c_contiguous
                rotated += 1
    assert rotated


def _history_and_batch(seed: int, *, checks: bool) -> tuple[BlockFronts, list[Coordinates]]:
    """Fronts of 30 random history steps (solved every 10th, with ``checks``), and a batch."""
    rng = np.random.default_rng(seed)
    shape = tuple(int(n) for n in rng.integers(2, 5, 3))
    both = _Both(AnovaCoordinates(shape), math.prod(n + 1 for n in shape))
    for step in range(30):
        _random_history_step(rng, both, shape)
        if checks and step % 10 == 9:
            both.check(_queries(rng, both, shape))
    both.fronts._absorb()
    return both.fronts, _queries(rng, both, shape)


@pytest.mark.parametrize("seed", range(4))
def test_the_forward_substitution_leaves_the_parts_off_the_fronts(seed: int) -> None:
    """``work`` after :meth:`_forward`: ``q - R^T w``, off each fitted front's directions.

    (:meth:`solve_batch` reads it as the queries' remainders; a dense ``R`` checks it.)
    """
    fronts, queries = _history_and_batch(300 + seed, checks=False)
    blocks = fronts._table()
    work, _ = fronts_module._columns(blocks, queries)
    q = work.copy()
    fitted, _ = fronts._forward(blocks, work, queries, None)
    assert fitted
    r_transpose_w = np.zeros_like(q)
    for block, w in fitted.items():
        front = fronts._fronts[block]
        start, stop = blocks.bounds(block)
        r_transpose_w[start:stop] += front.directions.T @ (front.factor.T @ w)
        r_transpose_w[front.columns] += front.below.T @ w
        scale = np.abs(q).max()
        assert np.allclose(front.directions @ work[start:stop], 0.0, atol=1e-12 * scale)
    assert np.allclose(work, q - r_transpose_w, atol=1e-12 * np.abs(q).max())


@pytest.mark.parametrize("seed", range(4))
def test_the_back_substitution_holds_y_over_the_fronts_rows(seed: int) -> None:
    """``y`` has a row per direction of a front, not per coordinate, kept across solves.

    (Its values: the solves against the span solver and the dense reference, elsewhere.)
    """
    fronts, queries = _history_and_batch(400 + seed, checks=True)
    blocks = fronts._table()
    work, _ = fronts_module._columns(blocks, queries)
    fitted, _ = fronts._forward(blocks, work, queries, None)
    along = fronts._back(blocks, fitted)
    y = next(iter(along.values())).base
    assert y is not None and y.shape[0] == fronts.rank < blocks.size
    firsts = fronts._rows_of_y(blocks)[0]
    for block, part in along.items():
        assert part.base is y and np.shares_memory(part, y[firsts[block] :])


@pytest.mark.parametrize("seed", range(4))
def test_the_classes_matrix_grown_in_place_gives_the_values_of_one_made_anew(seed: int) -> None:
    """A block new or outgrowing its room takes columns after the others (its entries moved).

    The values then are those of the matrix made from the blocks anew, to the bit (a row's
    entries stay in the order of the blocks), and so are the classes' rows kept per block.
    """
    rng = np.random.default_rng(300 + seed)
    shape = (6, 5, 4)
    space = AnovaCoordinates(shape)
    fronts = BlockFronts(space, residual=RESIDUAL)
    moved = 0
    for step in range(60):
        j = fronts.add(*space.of(_random_vector(rng, shape)))
        fronts.weigh(j, float(rng.choice([0.04, 1.0, 25.0])))
        if step % 3 != 2:
            continue
        queries = [space.of(_random_vector(rng, shape)) for _ in range(3)]
        queries.append(fronts._vectors[int(rng.integers(fronts.size))])
        found, _ = fronts.solve_many(queries)
        spreading = fronts._by_class
        assert spreading is not None
        moved += spreading.matrix.shape[1] > sum(spreading.rooms.values())  # (columns left)
        anew = fronts.copy()
        anew._by_class = anew._rows_of_classes = None
        again, _ = anew.solve_many(queries)
        for values, expected in zip(found, again):
            assert (values is None) == (expected is None)
            assert values is None or np.array_equal(values, expected)
    assert moved
