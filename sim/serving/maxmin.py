"""Weighted max-min fair rates by progressive filling over link indices (the arithmetic of
:class:`sim.serving.network.Network`'s rate allocation, kept apart so it can be tested alone).

A class is a set of flows with one path (a tuple of link indices) and a total weight; every
function here is pure apart from the ``residual`` list it is given to update.
"""

from __future__ import annotations

import heapq


def fill_classes(
    paths: list[tuple[int, ...]], weights: list[float], residual: list[float]
) -> list[float]:
    """Progressive filling of classes with link-index ``paths`` and total ``weights`` over
    ``residual`` (updated in place); returns each class's share per unit weight (see
    :meth:`sim.serving.network.Network._fill`)."""
    n_links = len(residual)
    members, weight_on, count_on, used = _incidence(paths, weights, n_links)
    version = [0] * n_links
    heap: list[tuple[float, int, int, int]] = [  # (share, seq, version, link index)
        ((r if (r := residual[j]) > 0.0 else 0.0) / weight_on[j], seq, 0, j)
        for seq, j in enumerate(used)
    ]  # r if r > 0.0 else 0.0 is max(0.0, r), NaN and -0.0 included, without a call
    seq = len(heap)
    heapq.heapify(heap)
    heappop, heappush = heapq.heappop, heapq.heappush
    frozen = [False] * len(paths)
    shares = [0.0] * len(paths)
    while heap:
        share, _, ver, top = heappop(heap)
        if count_on[top] == 0 or ver != version[top]:
            continue  # stale entry, or every class on the link already frozen
        touched: dict[int, int] = {}  # other links updated this round -> last update
        step = 0
        for i in members[top]:
            if frozen[i]:
                continue
            frozen[i] = True
            w = weights[i]
            rate = w * share
            shares[i] = share
            for j in paths[i]:
                residual[j] -= rate
                left = count_on[j] - 1
                count_on[j] = left
                if left == 0:
                    continue
                weight_on[j] -= w
                if j != top:
                    touched[j] = step
                    step += 1
        if touched:
            order = sorted(touched, key=touched.__getitem__) if len(touched) > 1 else touched
            for j in order:
                if count_on[j]:
                    v = version[j] + 1
                    version[j] = v
                    r = residual[j]
                    heappush(heap, ((r if r > 0.0 else 0.0) / weight_on[j], seq, v, j))
                    seq += 1
    return shares


def _incidence(
    paths: list[tuple[int, ...]], weights: list[float], n_links: int
) -> tuple[list[list[int]], list[float], list[int], list[int]]:
    """The class/link incidence :func:`fill_classes` starts from, for classes with link-index
    ``paths`` and ``weights``: per link its class positions in order, their total weight
    (added class by class in order) and their count, and the links used, in first-use
    order."""
    members: list[list[int]] = [[] for _ in range(n_links)]  # class positions per link
    weight_on = [0.0] * n_links  # unfrozen weight per link
    count_on = [0] * n_links  # unfrozen classes per link; the link is done at 0
    used: list[int] = []  # links in first-use order
    for i, lix in enumerate(paths):
        w = weights[i]
        for j in lix:
            if count_on[j] == 0:
                used.append(j)
            members[j].append(i)
            weight_on[j] += w
            count_on[j] += 1
    return members, weight_on, count_on, used
