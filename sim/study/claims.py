"""The articles' claims, measured over seeds: paired bootstrap intervals and a verdict.

A claim (a scenario's ``claims:`` entry, :class:`sim.scenario.Claim`) compares the claim's
``variant`` (side B) with its ``baseline`` variant (side A) on one summary metric. Both
variants run on the same seeds, so seed ``s`` gives both the same arrivals: the runs are
paired, as in ``pdsim ab`` (:mod:`sim.study.ab`, whose runner, cache and bootstrap this reuses).

The effect is measured as the article states it:

* ``relative``: ``mean(B) / mean(A) - 1`` in percent;
* ``ratio``: ``mean(B) / mean(A)``;
* ``value``: ``mean(B)`` (no verdict: a value says nothing about a mechanism).

The interval is the percentile bootstrap 95% interval of that effect over resampled seed pairs
(:func:`sim.study.ab.paired_relative_bootstrap`, ``resamples`` resamples from
``numpy.random.default_rng(boot_seed)``, one generator per claim: reproducible). The verdict
compares the interval with the null (0% or 1x) and with the article's figure ``expected``:

* **reproduced** -- the interval lies on the article's side of the null and covers the
  article's figure or lies beyond it;
* **same direction, smaller** -- on the article's side, but entirely short of its figure;
* **no effect** -- the interval contains the null;
* **opposite** -- the interval lies on the other side of the null.

A claim with a ``capacity:`` section (R21) compares capacities instead: per seed, the highest
offered load of a ladder each variant sustains at the SLO, per GPU (:mod:`sim.study.claim_capacity`).

A single ``pdsim run`` is one seed: its claims carry the measured figure with ``seeds: 1`` and
no interval or verdict (``ci_low``, ``ci_high`` and ``verdict`` are ``None``).

``python -m sim.study.claims`` runs every shipped claim scenario (or those named) and prints the
table; ``--write-readme`` puts it between the claims markers of README.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import InputError
from sim.scenario import Claim, Scenario, load_scenario
from sim.study.ab import paired_bootstrap, paired_relative_bootstrap
from sim.study.claim_capacity import capacities, rung_points
from sim.study.sweep.execute import Runner, results_frame
from sim.study.sweep.resultcache import RunCache, write_atomic
from sim.study.sweep.spec import Point, build_points

#: the fewest seeds a verdict is given for (below it the table says "too few seeds")
MIN_SEEDS = 10

VERDICTS = ("reproduced", "same direction, smaller", "no effect", "opposite")

README_BEGIN = "<!-- claims:begin -->"
README_END = "<!-- claims:end -->"


@dataclass(frozen=True)
class ClaimOutcome:
    """One claim measured over ``seeds`` paired seeds (``measured`` and the interval are in
    the claim's ``kind``: percent for ``relative``, x for ``ratio``)."""

    id: str
    article: str
    metric: str
    kind: str
    variant: str | None
    baseline: str | None
    expected: float | None
    measured: float | None
    ci_low: float | None
    ci_high: float | None
    seeds: int
    verdict: str | None
    scenario: str = ""
    #: what the effect is a ratio of, where the table alone does not say (capacity claims:
    #: each variant's mean capacity)
    detail: str = ""


def null_value(kind: str) -> float:
    """The effect of no effect: 0 % for ``relative``, 1x for ``ratio``."""
    return 1.0 if kind == "ratio" else 0.0


def verdict(kind: str, expected: float | None, lo: float, hi: float) -> str | None:
    """The verdict for an interval ``[lo, hi]`` of a ``kind`` effect against the article's
    ``expected`` figure (see the module docstring); ``None`` for ``value`` claims or claims
    without an expected figure."""
    if kind == "value" or expected is None:
        return None
    null = null_value(kind)
    if lo <= null <= hi:
        return "no effect"
    up = expected > null
    if (lo > null) != up:
        return "opposite"
    reaches = hi >= expected if up else lo <= expected
    return "reproduced" if reaches else "same direction, smaller"


def effect(
    kind: str,
    a: np.ndarray,
    b: np.ndarray,
    rng: np.random.Generator,
    resamples: int = 2000,
) -> tuple[float, float, float] | None:
    """``(estimate, ci_low, ci_high)`` of the ``kind`` effect of ``b`` over ``a`` (paired);
    ``None`` where it is undefined (mean of ``a`` zero, or fewer than 2 pairs)."""
    if a.size < 2:
        return None
    if kind == "value":
        return paired_bootstrap(np.zeros_like(b), b, rng, resamples)
    rel = paired_relative_bootstrap(a, b, rng, resamples)
    if rel is None:
        return None
    if kind == "relative":
        return rel[0] * 100.0, rel[1] * 100.0, rel[2] * 100.0
    return rel[0] + 1.0, rel[1] + 1.0, rel[2] + 1.0


def _variant_names(sc: Scenario, claim: Claim) -> tuple[str | None, str | None]:
    """(baseline, variant) names of ``claim`` with the defaults of :class:`Claim` resolved."""
    first = sc.variants[0].name if sc.variants else None
    return claim.baseline or first, claim.variant or first


def claim_points(
    path: str | Path, seeds: list[int], base: list[str] | None = None
) -> tuple[Scenario, dict[str | None, list[Point]]]:
    """The scenario at ``path`` and the points of every variant its claims measure at the
    scenario's load (same seeds); every override, and the first rung of every capacity
    claim's ladder, is validated before anything runs."""
    if len(seeds) < 2:
        raise InputError(f"--seeds {len(seeds)}: a claim needs at least 2 paired seeds")
    sc = load_scenario(path)
    if not sc.claims:
        raise InputError("claims: the scenario has none to measure", source=str(path))
    names: list[str | None] = []
    for c in sc.claims:
        for n in _variant_names(sc, c):
            if c.capacity is not None:
                rung_points(path, c.capacity, n or "", seeds[:1], c.capacity.loads[0], base)
            elif n not in names:
                names.append(n)
    pts = {
        n: build_points(path, {}, seeds, list(base or []), n, source=f"{path} ({n or 'base'})")
        for n in names
    }
    return sc, pts


def evaluate_scenario(
    path: str | Path,
    seeds: list[int],
    out: str | Path,
    *,
    base: list[str] | None = None,
    workers: int = 1,
    resamples: int = 2000,
    boot_seed: int = 0,
    counts: dict[str, int] | None = None,
) -> list[ClaimOutcome]:
    """Run the variants the claims of the scenario at ``path`` need on ``seeds`` (runs cached by
    config hash under ``out``) and measure each claim; seeds whose run failed on either side
    are left out of that claim (``seeds`` counts the pairs used). ``counts`` (if given) gets
    ``ran`` and ``cached`` added: runs simulated now and runs found in the cache."""
    sc, pts = claim_points(path, seeds, base)
    cache = RunCache(Path(out))
    caps: dict[int, dict[str, dict[int, float]]] = {}
    with Runner(workers) as runner:
        batch = runner.run([p for ps in pts.values() for p in ps], cache)
        for i, c in enumerate(sc.claims):
            if c.capacity is not None:
                ab = [n or "" for n in _variant_names(sc, c)]
                caps[i] = capacities(path, sc, c.capacity, ab, seeds, cache, runner, base, counts)
    if counts is not None:
        counts["ran"] = counts.get("ran", 0) + batch.ran
        counts["cached"] = counts.get("cached", 0) + batch.cached
    frames = {n: results_frame(ps, batch.records) for n, ps in pts.items()}
    outcomes: list[ClaimOutcome] = []
    for i, c in enumerate(sc.claims):
        a_name, b_name = _variant_names(sc, c)
        detail = ""
        if i in caps:
            ca, cb = caps[i][a_name or ""], caps[i][b_name or ""]
            a = np.array([ca[s] for s in seeds], dtype=float)
            b = np.array([cb[s] for s in seeds], dtype=float)
            detail = (
                f"capacity at the SLO, mean req/s per GPU: {a_name} {a.mean():.3g}, "
                f"{b_name} {b.mean():.3g}"
            )
        else:
            fa, fb = frames[a_name], frames[b_name]
            ok_a = fa[fa["status"] == "ok"].set_index("seed")
            ok_b = fb[fb["status"] == "ok"].set_index("seed")
            common = sorted(set(ok_a.index) & set(ok_b.index))
            a = _column(ok_a, c.metric, common)
            b = _column(ok_b, c.metric, common)
        keep = np.isfinite(a) & np.isfinite(b)
        a, b = a[keep], b[keep]
        rng = np.random.default_rng([boot_seed, i])
        est = effect(c.kind, a, b, rng, resamples)
        m, lo, hi = est if est is not None else (None, None, None)
        n = int(a.size)
        v = None
        if lo is not None and hi is not None:
            v = verdict(c.kind, c.expected, lo, hi) if n >= MIN_SEEDS else None
        outcomes.append(
            ClaimOutcome(
                c.id, c.article, c.metric, c.kind, b_name, a_name, c.expected, m, lo, hi, n, v,
                sc.name, detail,
            )
        )  # fmt: skip
    return outcomes


def _column(frame: Any, metric: str, seeds: list[int]) -> np.ndarray:
    import pandas as pd

    if metric not in frame.columns:
        return np.full(len(seeds), np.nan)
    col: np.ndarray = pd.to_numeric(frame.loc[seeds, metric], errors="coerce").to_numpy(dtype=float)
    return col


def single_run_fields(measured: float | None) -> dict[str, Any]:
    """The interval and verdict fields of a claim measured by one run (one seed): none."""
    return {"measured": measured, "ci_low": None, "ci_high": None, "seeds": 1, "verdict": None}


# -- presentation -----------------------------------------------------------------------------


def fmt_effect(kind: str, v: float | None) -> str:
    """An effect in the claim's terms: ``+12.3%``, ``1.85x`` or a plain number."""
    if v is None or not np.isfinite(v):
        return "n/a"
    if kind == "relative":
        return f"{v:+.1f}%"
    if kind == "ratio":
        return f"{v:.2f}x"
    return f"{v:.4g}"


def fmt_measured(o: ClaimOutcome) -> str:
    """``measured [ci_low, ci_high]`` in the claim's terms."""
    if o.measured is None:
        return "n/a"
    if o.ci_low is None or o.ci_high is None:
        return fmt_effect(o.kind, o.measured)
    lo, hi = fmt_effect(o.kind, o.ci_low), fmt_effect(o.kind, o.ci_high)
    return f"{fmt_effect(o.kind, o.measured)} [{lo}, {hi}]"


def fmt_verdict(o: ClaimOutcome) -> str:
    """The verdict, or why there is none."""
    if o.verdict is not None:
        return o.verdict
    if o.measured is None:
        return "not measured"
    if o.seeds < MIN_SEEDS:
        return f"too few seeds (< {MIN_SEEDS})"
    return "-"


def markdown_table(outcomes: list[ClaimOutcome]) -> str:
    """The claims as a Markdown table: claim | scenario | article | measured (95% CI) | seeds |
    verdict."""
    lines = [
        "| claim | scenario (B vs A) | article | measured (95% CI) | seeds | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        what = f"`{o.scenario}` {o.variant} vs {o.baseline}: `{o.metric}`"
        lines.append(
            f"| {o.id} | {what} | {o.article} | {fmt_measured(o)} | {o.seeds} | {fmt_verdict(o)} |"
        )
    return "\n".join(lines) + "\n"


def replace_between_markers(text: str, block: str, source: str = "README.md") -> str:
    """``text`` with what lies between :data:`README_BEGIN` and :data:`README_END` replaced by
    ``block``; :class:`InputError` when the markers are missing or out of order."""
    i, j = text.find(README_BEGIN), text.find(README_END)
    if i < 0 or j < i:
        raise InputError(
            f"needs the markers {README_BEGIN} and {README_END}, in that order", source=source
        )
    return text[: i + len(README_BEGIN)] + "\n" + block + text[j:]


def claim_scenarios() -> list[Path]:
    """The shipped scenarios that have claims, in name order."""
    import yaml

    from sim.shipped import shipped_path, shipped_scenarios

    out = []
    for name in shipped_scenarios():
        p = shipped_path(name)
        data = yaml.safe_load(p.read_text()) if p is not None else None
        # plans and other files ship alongside the scenarios; only scenarios have claims
        if p is not None and isinstance(data, dict) and data.get("claims"):
            out.append(p)
    return out


def _id_order(o: ClaimOutcome) -> tuple[int, str]:
    """Requirement order: R3 before R11."""
    digits = "".join(ch for ch in o.id if ch.isdigit())
    return (int(digits) if digits else 1 << 30, o.id)


def main(argv: list[str] | None = None) -> int:
    """``python -m sim.study.claims [SCENARIO ...] [--seeds N] [--set K=V] [--workers N] [--out DIR]
    [--write-readme FILE]``: measure the claims, print the table and, last, one JSON line."""
    ap = argparse.ArgumentParser(prog="python -m sim.study.claims", description=main.__doc__)
    ap.add_argument("scenarios", nargs="*", help="claim scenarios (default: every shipped one)")
    ap.add_argument("--seeds", default=str(MIN_SEEDS), help="N, A-B or A,B,C (default 10)")
    ap.add_argument("--set", dest="set_", action="append", default=[], metavar="K=V")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", default="runs/claims", help="run cache folder")
    ap.add_argument("--write-readme", metavar="FILE", default=None)
    args = ap.parse_args(argv)
    from sim.shipped import resolve_scenario
    from sim.study.sweep.spec import parse_seed_option

    try:
        seeds = parse_seed_option(args.seeds)
        paths = [resolve_scenario(s) for s in args.scenarios] or claim_scenarios()
        readme = Path(args.write_readme) if args.write_readme else None
        if readme is not None:  # check the markers before any work
            replace_between_markers(readme.read_text(), "", str(readme))
        for p in paths:
            claim_points(p, seeds, args.set_)
    except (InputError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    outcomes: list[ClaimOutcome] = []
    counts: dict[str, int] = {}
    for p in paths:
        t1 = time.perf_counter()
        outcomes += evaluate_scenario(
            p, seeds, Path(args.out) / p.stem, base=args.set_, workers=args.workers,
            counts=counts,
        )  # fmt: skip
        print(f"{p.stem}: {time.perf_counter() - t1:.1f} s", file=sys.stderr)
    wall = time.perf_counter() - t0
    outcomes.sort(key=_id_order)
    table = markdown_table(outcomes)
    ran, cached = counts.get("ran", 0), counts.get("cached", 0)
    print(table)
    for o in outcomes:
        if o.detail:
            print(f"{o.id} ({o.scenario}): {o.detail}")
    print(
        f"{len(outcomes)} claims, {len(seeds)} seeds x 2 arms: {ran} runs simulated, "
        f"{cached} from the cache ({args.out}), wall time {wall:.1f} s"
    )
    if readme is not None:
        cmd = f"python -m sim.study.claims --seeds {args.seeds} --write-readme {readme.name}"
        block = table + (
            f"\nGenerated by `{cmd}`: {len(seeds)} paired seeds per claim, {ran} runs "
            f"simulated ({cached} from the cache), {wall / 60:.1f} min of wall time.\n"
        )
        write_atomic(readme, replace_between_markers(readme.read_text(), block, str(readme)))
    print(
        json.dumps(
            {
                "wall_s": round(wall, 1),
                "ran": ran,
                "cached": cached,
                "claims": [asdict(o) for o in outcomes],
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
