"""A small derivative-free minimiser (Nelder–Mead) for fitting a handful of roofline constants.

The objective of a fit is a mean error over published measurements, a piecewise-smooth function
of a few parameters (a max of two rooflines per step): no gradients, cheap evaluations. Nelder–Mead
with the standard coefficients (reflection 1, expansion 2, contraction ½, shrink ½; Nelder and
Mead, The Computer Journal 7(4), 1965) and restarts from the best point is enough for 3–8
parameters; deterministic for a given start.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, *, step: float = 0.3,
                max_evals: int = 2000, tol: float = 1e-7, restarts: int = 2) -> tuple[np.ndarray, float]:
    """Minimise ``f`` from ``x0`` (unconstrained: callers map bounded parameters through a
    transform). Returns the best point and its value. ``step`` sizes the initial simplex along
    each axis; after convergence the search restarts from the best point ``restarts`` times, which
    escapes the simplex collapses Nelder–Mead is known for."""
    best_x = np.asarray(x0, dtype=np.float64)
    best_f = f(best_x)
    evals = 1
    for _ in range(restarts + 1):
        x, fx, used = _one_run(f, best_x, step, max_evals - evals, tol)
        evals += used
        improved = fx < best_f - tol
        if fx <= best_f:
            best_x, best_f = x, fx
        if not improved or evals >= max_evals:
            break
    return best_x, float(best_f)


def _one_run(f: Callable[[np.ndarray], float], x0: np.ndarray, step: float, budget: int,
             tol: float) -> tuple[np.ndarray, float, int]:
    n = len(x0)
    simplex = np.vstack([x0] + [x0 + step * np.eye(n)[i] for i in range(n)])
    values = np.array([f(p) for p in simplex])
    evals = n + 1
    while evals < budget:
        order = np.argsort(values, kind="stable")
        simplex, values = simplex[order], values[order]
        if values[-1] - values[0] <= tol * (abs(values[0]) + tol):
            break
        centroid = simplex[:-1].mean(axis=0)
        worst = simplex[-1]
        reflected = centroid + (centroid - worst)
        fr = f(reflected)
        evals += 1
        if fr < values[0]:
            expanded = centroid + 2 * (centroid - worst)
            fe = f(expanded)
            evals += 1
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            inside = fr >= values[-1]
            contracted = centroid + (0.5 * (worst - centroid) if inside else 0.5 * (reflected - centroid))
            fc = f(contracted)
            evals += 1
            if fc < min(fr, values[-1]):
                simplex[-1], values[-1] = contracted, fc
            else:  # shrink towards the best vertex
                simplex[1:] = simplex[0] + 0.5 * (simplex[1:] - simplex[0])
                values[1:] = [f(p) for p in simplex[1:]]
                evals += n
    i = int(np.argmin(values))
    return simplex[i].copy(), float(values[i]), evals
