"""Minimum-cost bipartite assignment (the Hungarian method), for DETR-style losses.

transformers' matchers call ``scipy.optimize.linear_sum_assignment``; scipy is not among core's
dependencies, so this is the same assignment in NumPy: the shortest-augmenting-path form of the
Hungarian method with row and column potentials, O(rows^2 x columns) with the inner loop over
columns vectorised. A detector matches a few objects per image against hundreds of queries, so
the rows are the objects and every step is one NumPy pass over the queries.
"""

from __future__ import annotations

import numpy as np


def linear_sum_assignment(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows, columns) of the assignment of least total cost: every row of the shorter side is
    matched to a distinct one of the other; rows ascending, as scipy returns them."""
    cost = np.asarray(cost, dtype=np.float64)
    if cost.ndim != 2:
        raise ValueError(f"cost must be a matrix, got shape {cost.shape}")
    if cost.shape[0] > cost.shape[1]:
        columns, rows = linear_sum_assignment(cost.T)
        order = np.argsort(rows)
        return rows[order], columns[order]
    if cost.shape[0] == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    row_of_column = _augment_every_row(cost)
    matched = np.nonzero(row_of_column[1:])[0]
    rows = row_of_column[1:][matched] - 1
    order = np.argsort(rows)
    return rows[order].astype(np.int64), matched[order].astype(np.int64)


def _augment_every_row(cost: np.ndarray) -> np.ndarray:
    """Column j+1 -> its matched row + 1 (0: unmatched); index 0 is the search's virtual column."""
    n_rows, n_columns = cost.shape
    row_potential = np.zeros(n_rows + 1)
    column_potential = np.zeros(n_columns + 1)
    row_of_column = np.zeros(n_columns + 1, dtype=np.int64)
    previous_column = np.zeros(n_columns + 1, dtype=np.int64)
    for row in range(1, n_rows + 1):
        row_of_column[0] = row
        column = 0
        slack = np.full(n_columns + 1, np.inf)
        visited = np.zeros(n_columns + 1, dtype=bool)
        while row_of_column[column] != 0:
            visited[column] = True
            current_row = row_of_column[column]
            reduced = cost[current_row - 1] - row_potential[current_row] - column_potential[1:]
            open_columns = ~visited[1:]
            tighter = open_columns & (reduced < slack[1:])
            slack[1:][tighter] = reduced[tighter]
            previous_column[1:][tighter] = column
            candidates = np.where(open_columns, slack[1:], np.inf)
            next_column = int(np.argmin(candidates)) + 1
            delta = candidates[next_column - 1]
            visited_columns = np.nonzero(visited)[0]
            row_potential[row_of_column[visited_columns]] += delta
            column_potential[visited_columns] -= delta
            slack[1:][open_columns] -= delta
            column = next_column
        while column != 0:  # flip the augmenting path back to the virtual column
            before = previous_column[column]
            row_of_column[column] = row_of_column[before]
            column = before
    return row_of_column
