"""How a task's examples are cut among the sites of a simulated federation (the same cut on every
party: it depends only on the labels, the number of sites and a seed)."""

from __future__ import annotations

import numpy as np

__all__ = ["dirichlet_partition"]


def dirichlet_partition(labels: np.ndarray, sites: int, alpha: float, seed: int) -> list[np.ndarray]:
    """Label-skewed partition: each class is shared among sites in Dirichlet(alpha) proportions.

    Returns one sorted index array per site; together they cover every example once.
    Every site gets at least one example (a site left empty takes one from the largest).
    """
    if sites < 1 or alpha <= 0:
        raise ValueError(f"need sites >= 1 and alpha > 0, got sites={sites}, alpha={alpha}")
    rng = np.random.default_rng(seed)
    parts: list[list[int]] = [[] for _ in range(sites)]
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        cuts = (np.cumsum(rng.dirichlet(np.full(sites, alpha)))[:-1] * len(idx)).astype(int)
        for site, chunk in enumerate(np.split(idx, cuts)):
            parts[site].extend(chunk.tolist())
    for site in range(sites):
        if not parts[site]:
            donor = max(range(sites), key=lambda s: len(parts[s]))
            parts[site].append(parts[donor].pop())
    return [np.sort(np.array(p, dtype=np.int64)) for p in parts]
