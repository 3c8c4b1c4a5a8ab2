"""The exact best placement of cuts, and the best chunk count, under the simulator's cost.

For a given chunk count M the makespan is ``T + sum(links) + (M - 1) * max(stages + links)``
(``costmodel.simulate``), with ``T`` the fixed sum of segment times. For each candidate bottleneck
value b (every possible stage or link time, ascending) a DP finds the cuts with every stage and link
<= b that minimise the sum of link times; the best b wins. Stopping once ``(M - 1) * b`` alone exceeds
the best found keeps it fast.
"""

from __future__ import annotations

from collections.abc import Sequence

from costmodel.simulate import closed_form_makespan, segment_costs, simulate
from costmodel.types import Machine, Prediction, Profile

__all__ = ["best_cuts", "optimal", "ranked"]


def best_cuts(seg: Sequence[float], link: Sequence[float], stages: int, chunks: int,
              overhead: float = 0.0) -> tuple[list[int], float]:
    """Cuts (indices into ``seg``) minimising the makespan; ``link[i]`` is the cost of a cut before ``i + 1``.

    ``seg``: seconds per microbatch of each segment; ``overhead``: fixed seconds per stage per microbatch.
    """
    n = len(seg)
    if not 1 <= stages <= n:
        raise ValueError(f"cannot make {stages} stages from {n} segments")
    prefix = [0.0]
    for t in seg:
        prefix.append(prefix[-1] + t)

    def stage(a: int, b: int) -> float:
        return prefix[b] - prefix[a] + overhead

    values = sorted({stage(a, b) for a in range(n) for b in range(a + 1, n + 1)} | set(link[: n - 1]))
    best: tuple[float, list[int]] = (float("inf"), [])
    inf = float("inf")
    for cap in values:
        if (chunks - 1) * cap + prefix[n] >= best[0]:
            break
        # cost[k][j]: min sum of link times for segments[:j] in k stages, every stage and link <= cap
        cost = [[inf] * (n + 1) for _ in range(stages + 1)]
        back = [[-1] * (n + 1) for _ in range(stages + 1)]
        cost[0][0] = 0.0
        for k in range(1, stages + 1):
            for j in range(k, n + 1):
                for i in range(k - 1, j):
                    if cost[k - 1][i] == inf or stage(i, j) > cap:
                        continue
                    c = cost[k - 1][i]
                    if i > 0:
                        if link[i - 1] > cap:
                            continue
                        c += link[i - 1]
                    if c < cost[k][j]:
                        cost[k][j], back[k][j] = c, i
        if cost[stages][n] == inf:
            continue
        cuts, j = [], n
        for k in range(stages, 0, -1):
            j = back[k][j]
            if j > 0:
                cuts.append(j)
        cuts.reverse()
        stage_t = [stage(a, b) for a, b in zip([0, *cuts], [*cuts, n])]
        total = closed_form_makespan(stage_t, [link[c - 1] for c in cuts], chunks)
        if total < best[0] - 1e-15:
            best = (total, cuts)
    return best[1], best[0]


def optimal(profile: Profile, stages: int, chunks: Sequence[int], machine: Machine | None = None) -> Prediction:
    """The predicted-fastest cuts and chunk count among ``chunks``."""
    return ranked(profile, stages, chunks, machine)[0]


def ranked(profile: Profile, stages: int, chunks: Sequence[int], machine: Machine | None = None) -> list[Prediction]:
    """The optimal cuts for each chunk count, fastest first.

    The cuts are exact under the flow shop (each stage at its own speed); with a machine model the
    candidates are then ranked by the shared-device simulation, which changes the chunk count chosen
    (fill and drain cost less where idle stages lend their cores) more than the cuts.
    """
    out = []
    for m in chunks:
        if profile.batch_size % m:
            continue
        seg, link = segment_costs(profile, m)
        cuts, _ = best_cuts(seg, link, stages, m, profile.step_overhead_s)
        out.append(simulate(profile, cuts, m, machine=machine))
    if not out:
        raise ValueError(f"no chunk count in {list(chunks)} divides batch size {profile.batch_size}")
    return sorted(out, key=lambda p: p.makespan_s)

