"""Non-negative least squares for matrices whose columns have a few small integer entries.

Solves ``min ||diag(w) (A x - b)||₂`` subject to ``x >= 0`` with the active-set method of
Lawson & Hanson (*Solving Least Squares Problems*, 1974, ch. 23). NNLSHP's packing matrix
has one column per pack strategy (tens of thousands) but only as many rows as there are
sequence lengths and at most `depth` non-zeros per column, so:

* a column is stored as the row indices of its entries, repeated for entries > 1
  (``rows[j] = (99, 99, 199)`` is the column with 2 at row 99 and 1 at row 199), padded
  with ``n_rows`` (an always-zero row) after the real entries;
* the gradient ``Aᵀ W² (b - A x)`` costs `depth` look-ups per column;
* the least-squares problem on the passive set is solved through a Cholesky factor of its
  Gram matrix, grown by one row when a column enters and, when one leaves, mended by a
  rank-one update of the rows below it, so each step costs O(passive²) instead of a fresh
  factorisation.

It reaches the same minimum as ``scipy.optimize.nnls`` (the same method; where several x
attain the minimum, as with NNLSHP's matrices, the two may return different ones) in a
fraction of the time on these matrices (``scripts/bench_packing.py`` times NNLSHP; its record
is on the Benchmarks page, "Packing algorithms against the published values").
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _gram_entry(rows: np.ndarray, w2: np.ndarray, i: int, j: int) -> float:
    total = 0.0
    n = w2.shape[0] - 1
    for a in range(rows.shape[1]):
        row = rows[i, a]
        if row == n:
            break
        for b in range(rows.shape[1]):
            if rows[j, b] == row:
                total += w2[row]
    return total


@njit(cache=True)
def _forward(chol: np.ndarray, rhs: np.ndarray, start: int, p: int, y: np.ndarray) -> None:
    """y[start:p] of y = L⁻¹ rhs (L = chol[:p, :p] lower triangular; y[:start] known)."""
    for i in range(start, p):
        s = rhs[i]
        for k in range(i):
            s -= chol[i, k] * y[k]
        y[i] = s / chol[i, i]


@njit(cache=True)
def _backward(chol: np.ndarray, y: np.ndarray, p: int, out: np.ndarray) -> None:
    """out[:p] = L⁻ᵀ y[:p], reading L by rows (contiguous)."""
    for i in range(p):
        out[i] = y[i]
    for i in range(p - 1, -1, -1):
        out[i] /= chol[i, i]
        v = out[i]
        for k in range(i):
            out[k] -= chol[i, k] * v


@njit(cache=True)
def _delete(chol: np.ndarray, p: int, k: int) -> None:
    """Remove row/column k from the Gram matrix whose p×p Cholesky factor is chol."""
    u = np.empty(p - k - 1)
    for i in range(k + 1, p):
        u[i - k - 1] = chol[i, k]
    for i in range(k + 1, p):  # shift rows up, dropping column k
        for j in range(k):
            chol[i - 1, j] = chol[i, j]
        for j in range(k + 1, i + 1):
            chol[i - 1, j - 1] = chol[i, j]
    m = p - 1 - k
    for i in range(m):  # rank-one update of the trailing block with u
        a = chol[k + i, k + i]
        r = np.sqrt(a * a + u[i] * u[i])
        c = r / a
        s = u[i] / a
        chol[k + i, k + i] = r
        for j in range(i + 1, m):
            chol[k + j, k + i] = (chol[k + j, k + i] + s * u[j]) / c
            u[j] = c * u[j] - s * chol[k + j, k + i]
    for j in range(p):
        chol[p - 1, j] = 0.0
        chol[j, p - 1] = 0.0


@njit(cache=True)
def nnls_sparse(
    rows: np.ndarray, weights: np.ndarray, target: np.ndarray, max_iterations: int
) -> tuple[np.ndarray, int]:
    """``argmin ||w (A x - b)||`` over ``x >= 0``; returns x and the number of iterations."""
    n = target.shape[0]
    m = rows.shape[0]
    w2 = np.zeros(n + 1)  # squared weights; entry n is the padding row
    wb = np.zeros(n + 1)
    for i in range(n):
        w2[i] = weights[i] * weights[i]
        wb[i] = w2[i] * target[i]
    # c_j = (W A)ᵀ (W b): the right-hand side of every passive-set solve
    c = np.zeros(m)
    for j in range(m):
        for a in range(rows.shape[1]):
            c[j] += wb[rows[j, a]]
    scale = 0.0
    for i in range(n):
        scale += wb[i] * target[i]
    tolerance = 1e-12 * max(np.sqrt(scale), 1.0)

    x = np.zeros(m)
    passive = np.zeros(m, dtype=np.bool_)
    banned = np.zeros(m, dtype=np.bool_)
    order = np.zeros(n, dtype=np.int64)  # passive columns, in Cholesky order
    chol = np.zeros((n, n))
    z = np.zeros(n)  # passive-set solution
    y = np.zeros(n)  # L⁻¹ rhs, kept up to date row by row
    rhs = np.zeros(n)  # c at the passive columns
    gram = np.zeros(n)
    residual = wb.copy()  # W² (b - A x), padded
    p = 0
    iterations = 0
    while p < n and iterations < max_iterations:
        best = -1
        best_gradient = tolerance
        for j in range(m):
            if passive[j] or banned[j]:
                continue
            g = 0.0
            for a in range(rows.shape[1]):
                g += residual[rows[j, a]]
            if g > best_gradient:
                best_gradient = g
                best = j
        if best < 0:
            break
        iterations += 1
        # grow the Cholesky factor by the entering column
        diagonal = _gram_entry(rows, w2, best, best)
        for k in range(p):
            gram[k] = _gram_entry(rows, w2, order[k], best)
        norm = 0.0
        for i in range(p):
            s = gram[i]
            for k in range(i):
                s -= chol[i, k] * chol[p, k]
            chol[p, i] = s / chol[i, i]
            norm += chol[p, i] * chol[p, i]
        if diagonal - norm <= 1e-10 * diagonal:  # dependent on the passive columns
            for i in range(p):
                chol[p, i] = 0.0
            banned[best] = True
            continue
        chol[p, p] = np.sqrt(diagonal - norm)
        order[p] = best
        passive[best] = True
        rhs[p] = c[best]
        p += 1
        _forward(chol, rhs, p - 1, p, y)
        _backward(chol, y, p, z)
        if z[p - 1] <= 0.0:  # rounding made the entering column useless: skip it
            passive[best] = False
            banned[best] = True
            p -= 1
            _delete(chol, p + 1, p)
            continue
        for j in range(m):
            banned[j] = False
        while True:  # step back towards feasibility until the passive solution is positive
            alpha = 2.0
            leaving = -1
            for k in range(p):
                if z[k] <= 0.0:
                    xk = x[order[k]]
                    ratio = xk / (xk - z[k])
                    if ratio < alpha:
                        alpha = ratio
                        leaving = k
            if leaving < 0:
                break
            x_max = 0.0
            for k in range(p):
                j = order[k]
                x[j] += alpha * (z[k] - x[j])
                if x[j] > x_max:
                    x_max = x[j]
            x[order[leaving]] = 0.0
            first_changed = p
            for k in range(p - 1, -1, -1):  # drop the columns that reached zero
                j = order[k]
                if x[j] <= 1e-13 * x_max:
                    x[j] = 0.0
                    passive[j] = False
                    _delete(chol, p, k)
                    for q in range(k, p - 1):
                        order[q] = order[q + 1]
                        rhs[q] = rhs[q + 1]
                    p -= 1
                    first_changed = k
            _forward(chol, rhs, first_changed, p, y)
            _backward(chol, y, p, z)
        for k in range(p):
            x[order[k]] = z[k]
        for i in range(n + 1):
            residual[i] = wb[i]
        for k in range(p):
            j = order[k]
            for a in range(rows.shape[1]):
                row = rows[j, a]
                residual[row] -= w2[row] * x[j]
        residual[n] = 0.0
    return x, iterations
