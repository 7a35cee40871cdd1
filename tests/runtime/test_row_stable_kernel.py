"""The shim's row-stable kernel (app/runtime/sgemm_rows.c): a row of a CPU matrix product has the
same bits whatever the product's row count and wherever the row sits in it.

Products go through `mx.matmul`, so they reach the kernel the way a model's do (tests import app
first, which loads the shim before mlx.core). Sizes cover partial tiles: rows past a multiple of
4, columns past a multiple of 16 (and of 64 for B not transposed), depths past a multiple of 16.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from app.runtime.blas import row_stable_rows

MAX_ROWS = 70
pytestmark = pytest.mark.skipif(
    row_stable_rows() < MAX_ROWS or mx.default_device() != mx.cpu,
    reason="the row-stable kernel serves CPU products of up to row_stable_rows() rows",
)


def windows() -> list[tuple[int, int]]:
    """(start, rows) for every row count 1..MAX_ROWS, starting at varied offsets so that a given
    row lands at different positions of a tile."""
    return [(m * 7 % (MAX_ROWS + 1 - m), m) for m in range(1, MAX_ROWS + 1)]


def assert_rows_stable(x: mx.array, product) -> None:
    """Each window's product equals, row for row, the one-row products of the same rows."""
    single = [product(x[i : i + 1]) for i in range(MAX_ROWS)]
    mx.eval(single)
    for start, m in windows():
        got = product(x[start : start + m])
        for i in range(m):
            assert mx.array_equal(got[i : i + 1], single[start + i]).item(), (start, m, i)


@pytest.mark.parametrize(("n", "k"), [(256, 256), (37, 100), (130, 257), (5, 15)])
def test_rows_of_x_times_w_transposed_do_not_depend_on_the_row_count(n: int, k: int) -> None:
    """`x @ W.T` with W stored [n, k], as every linear layer calls it (B transposed)."""
    rng = np.random.default_rng(n * 1000 + k)
    x = mx.array(rng.standard_normal((MAX_ROWS, k), dtype=np.float32))
    w = mx.array(rng.standard_normal((n, k), dtype=np.float32))
    assert_rows_stable(x, lambda rows: rows @ w.T)
    full = np.array(x, dtype=np.float64) @ np.array(w, dtype=np.float64).T
    assert np.allclose(np.array(x @ w.T), full, atol=1e-3)


@pytest.mark.parametrize(("n", "k"), [(64, 256), (100, 130), (17, 33), (3, 1)])
def test_rows_of_x_times_b_do_not_depend_on_the_row_count(n: int, k: int) -> None:
    """`x @ B` with B stored [k, n] (B not transposed: attention's probabilities times values)."""
    rng = np.random.default_rng(n * 1000 + k + 1)
    x = mx.array(rng.standard_normal((MAX_ROWS, k), dtype=np.float32))
    b = mx.array(rng.standard_normal((k, n), dtype=np.float32))
    assert_rows_stable(x, lambda rows: rows @ b)
    full = np.array(x, dtype=np.float64) @ np.array(b, dtype=np.float64)
    assert np.allclose(np.array(x @ b), full, atol=1e-3)


@pytest.mark.parametrize("b_transposed", [True, False])
def test_a_transposed_input_gives_the_rows_of_a_contiguous_one(b_transposed: bool) -> None:
    """A stored [k, m] and read transposed (the kernel gathers its rows) gives the bits of A
    stored [m, k]."""
    rng = np.random.default_rng(7)
    n, k = 48, 80
    x = mx.array(rng.standard_normal((MAX_ROWS, k), dtype=np.float32))
    b = mx.array(rng.standard_normal((n, k) if b_transposed else (k, n), dtype=np.float32))
    op_b = b.T if b_transposed else b
    for start, m in windows()[::5]:
        rows = x[start : start + m]
        stored_transposed = mx.array(np.ascontiguousarray(np.array(rows).T))  # [k, m], which MLX passes as is
        assert mx.array_equal(stored_transposed.T @ op_b, rows @ op_b).item(), (start, m)
