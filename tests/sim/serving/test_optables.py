"""Op-table interpolation: exact at the knots, monotone between neighbouring knots, stated
growth beyond the last knot (property tests against simple reference models)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.serving.opcost.tables import CollectiveTable, Curves, Grid3, TableOrigin, interp_axis

ORIGIN = TableOrigin(device="test", framework="test", measured_at="2026-01-01", source="test")

knots = st.lists(st.integers(1, 10_000), min_size=2, max_size=5, unique=True).map(sorted)
values = st.floats(1e-6, 1.0, allow_nan=False, allow_infinity=False)


@st.composite
def grids(draw: st.DrawFn) -> Grid3:
    m, n, k = draw(knots), draw(knots), draw(knots)
    lat = [[[draw(values) for _ in k] for _ in n] for _ in m]
    return Grid3(m=m, n=n, k=k, latency_s=lat)


@settings(max_examples=60, deadline=None)
@given(grids())
def test_grid_is_exact_at_every_knot(g: Grid3) -> None:
    for (i, m), (j, n), (li, k) in itertools.product(
        enumerate(g.m), enumerate(g.n), enumerate(g.k)
    ):
        secs, extrapolated = g.lookup(m, n, k)
        assert secs == pytest.approx(g.latency_s[i][j][li], rel=1e-12)
        assert not extrapolated


@settings(max_examples=60, deadline=None)
@given(grids(), st.data())
def test_grid_is_monotone_between_neighbouring_knots(g: Grid3, data: st.DataObject) -> None:
    i = data.draw(st.integers(0, len(g.m) - 2))
    j = data.draw(st.integers(0, len(g.n) - 1))
    li = data.draw(st.integers(0, len(g.k) - 1))
    lo, hi = g.m[i], g.m[i + 1]
    xs = sorted(data.draw(st.lists(st.floats(lo, hi), min_size=2, max_size=6)))
    ys = [g.lookup(x, g.n[j], g.k[li])[0] for x in xs]
    a, b = g.latency_s[i][j][li], g.latency_s[i + 1][j][li]
    tol = 1e-12
    for y in ys:
        assert min(a, b) - tol <= y <= max(a, b) + tol
    pairs = list(itertools.pairwise(ys))
    assert all(q >= p - tol for p, q in pairs) or all(q <= p + tol for p, q in pairs)


def test_grid_reproduces_a_trilinear_function_and_grows_linearly_beyond() -> None:
    def f(m: float, n: float, k: float) -> float:
        return 1e-6 + 1e-12 * m * n * k + 1e-9 * (m * k + n * k)

    ax = [16, 64, 256, 1024]
    g = Grid3(m=ax, n=ax, k=ax, latency_s=[[[f(m, n, k) for k in ax] for n in ax] for m in ax])
    assert g.lookup(100, 300, 700)[0] == pytest.approx(f(100, 300, 700), rel=1e-9)
    beyond, extrapolated = g.lookup(100, 4096, 700)
    assert extrapolated
    assert beyond == pytest.approx(g.lookup(100, 1024, 700)[0] * 4)
    # below the first knot: the first knot's value (a kernel's floor)
    assert g.lookup(1, 16, 16)[0] == pytest.approx(f(16, 16, 16))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_curves_exact_at_knots_and_monotone_between(data: st.DataObject) -> None:
    batch = data.draw(knots)
    xs = [data.draw(knots) for _ in batch]
    ys = [[data.draw(values) for _ in x] for x in xs]
    c = Curves(batch=batch, x=xs, latency_s=ys)
    for bi, b in enumerate(batch):
        for xi, x in enumerate(xs[bi]):
            secs, extra = c.lookup(b, x, x_power=2.0)
            assert secs == pytest.approx(ys[bi][xi], rel=1e-12) and not extra
    bi = data.draw(st.integers(0, len(batch) - 2))
    x = data.draw(st.sampled_from(sorted(set(xs[bi]) & set(xs[bi + 1])) or [None]))
    if x is not None:
        lo, hi = c.lookup(batch[bi], x, 1.0)[0], c.lookup(batch[bi + 1], x, 1.0)[0]
        mids = [
            c.lookup(batch[bi] + f * (batch[bi + 1] - batch[bi]), x, 1.0)[0]
            for f in (0.25, 0.5, 0.75)
        ]
        seq = [lo, *mids, hi]
        pairs = list(itertools.pairwise(seq))
        assert all(q >= p - 1e-12 for p, q in pairs) or all(q <= p + 1e-12 for p, q in pairs)


def test_curves_extrapolate_context_with_the_stated_power() -> None:
    c = Curves(batch=[1, 4], x=[[128, 1024], [128, 512]], latency_s=[[1e-5, 4e-5], [2e-5, 5e-5]])
    quad, extra = c.lookup(1, 2048, x_power=2.0)
    assert extra and quad == pytest.approx(4e-5 * 4)
    lin, _ = c.lookup(1, 2048, x_power=1.0)
    assert lin == pytest.approx(4e-5 * 2)
    # halfway between batch knots at a shared x knot: the mean
    assert c.lookup(2.5, 128, 1.0)[0] == pytest.approx(1.5e-5)


def test_collective_lookup_and_interp_axis() -> None:
    t = CollectiveTable(origin=ORIGIN, group=2, bytes=[1024, 4096], latency_s=[1e-5, 3e-5])
    assert t.lookup(1024) == (1e-5, False)
    assert t.lookup(2560)[0] == pytest.approx(2e-5)
    assert t.lookup(8192) == (pytest.approx(6e-5), True)
    assert t.lookup(10) == (1e-5, False)
    assert interp_axis([1, 3], 2) == (0, 1, 0.5, 1.0)


def test_tables_reject_bad_shapes() -> None:
    with pytest.raises(ValueError, match="shape"):
        Grid3(m=[1, 2], n=[1], k=[1], latency_s=[[[1.0]]])
    with pytest.raises(ValueError, match="ascending"):
        Grid3(m=[2, 1], n=[1], k=[1], latency_s=[[[1.0]], [[1.0]]])
    with pytest.raises(ValueError, match="> 0"):
        Curves(batch=[1], x=[[1, 2]], latency_s=[[1.0, 0.0]])
