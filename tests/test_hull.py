"""Per-prompt upper hulls: the docstring example, brute force over all chords, and invariants."""

import numpy as np
import pytest

from isocompute.solver.hull import BLOCK, upper_hulls


def hull_vertices(h, i):
    """Action indices of prompt i's hull vertices, read back from the edge slots."""
    ends = [slot + 1 for slot in range(h.slope.shape[0]) if h.slope[slot, i] > -np.inf]
    return [int(h.start[i]), *ends]


def brute_vertices(u, c):
    """Upper-hull vertices by definition: not dominated, strictly above every chord of two others."""
    a = len(u)
    keep = []
    for j in range(a):
        dominated = any((c[i] < c[j] and u[i] >= u[j]) or (c[i] == c[j] and (u[i] > u[j] or (u[i] == u[j] and i < j)))
                        for i in range(a) if i != j)
        if dominated:
            continue
        keep.append(j)
    out = []
    for j in keep:
        above = all(
            (u[j] - u[i]) * (c[k] - c[i]) > (u[k] - u[i]) * (c[j] - c[i])
            for i in keep for k in keep if c[i] < c[j] < c[k]
        )
        if above:
            out.append(j)
    return out


def test_docstring_example():
    h = upper_hulls([[0.3, 0.5, 0.6, 0.6]], [[1.0, 2.0, 4.0, 8.0]])
    assert hull_vertices(h, 0) == [0, 1, 2]
    np.testing.assert_allclose(h.slope[:2, 0], [0.2, 0.05])
    assert h.slope[2, 0] == -np.inf and h.d_cost[2, 0] == 0
    assert h.actions_at(0.1).tolist() == [1] and h.actions_at(0.0).tolist() == [2]
    assert h.actions_at(np.inf).tolist() == [0]


@pytest.mark.parametrize("seed", range(4))
def test_matches_brute_force_across_blocks(seed):
    rng = np.random.default_rng(seed)
    n = BLOCK + 500  # two blocks
    U = rng.integers(0, 5, (n, 5)) / 4 if seed % 2 else rng.random((n, 5))
    C = np.sort(rng.integers(1, 6, (n, 5)), axis=1).astype(float)
    h = upper_hulls(U, C)
    for i in rng.choice(n, 400, replace=False).tolist() + [n - 1]:
        assert hull_vertices(h, i) == brute_vertices(U[i], C[i]), (U[i], C[i])
    real = h.slope > -np.inf
    assert (h.d_cost[real] > 0).all() and (h.d_utility[real] > 0).all()
    # along each prompt the real slopes strictly decrease
    masked = np.where(real, h.slope, np.nan)
    for a in range(masked.shape[0]):
        for b in range(a + 1, masked.shape[0]):
            both = real[a] & real[b]
            assert (masked[a][both] > masked[b][both]).all()
