"""sim.serving.metrics.summarize against a plain pandas reference (frame filters and groupbys).

``summarize`` reads the request frame as column arrays and selects with index arrays (it
never copies the frame: the 1M-request memory bound). The reference below is the frame
version it replaced; both must give the same figures, bit for bit, in the same key order.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.serving.metrics import Metrics, _pct, _round, summarize

STATUS = ["pending", "done", "shed", "rejected", "degraded"]
MODELS = ["m0", "m1"]
CLASSES = ["high", "normal", "batch"]


def _ref_lat(g: pd.DataFrame) -> dict:
    out = g["output_tokens"].to_numpy()
    multi = out > 1
    tpot = ((g["end"] - g["first_token"]).to_numpy()[multi]) / (out[multi] - 1)
    return {
        "e2e": _pct((g["end"] - g["arrival"]).to_numpy()),
        "ttft": _pct((g["first_token"] - g["arrival"]).to_numpy()),
        "tpot": _pct(tpot),
    }


def _ref_ok(g: pd.DataFrame, classes: dict) -> np.ndarray:
    cls = g["cls"].astype(str)
    ok = np.ones(len(g), dtype=bool)
    e2e = (g["end"] - g["arrival"]).to_numpy()
    ttft = (g["first_token"] - g["arrival"]).to_numpy()
    out = g["output_tokens"].to_numpy()
    tpot = np.where(out > 1, (g["end"] - g["first_token"]).to_numpy() / np.maximum(out - 1, 1), 0.0)
    for key, val in (("e2e", e2e), ("ttft", ttft), ("tpot", tpot)):
        lim = cls.map({k: (v[key] if v[key] is not None else np.inf) for k, v in classes.items()})
        ok &= val <= lim.to_numpy(dtype=float)
    return ok


def _reference(df: pd.DataFrame, w0: float, w1: float, classes: dict) -> dict:
    span = max(w1 - w0, 1e-12)
    arr = df["arrival"].to_numpy()
    win = df[(arr >= w0) & (arr <= w1)]
    done = win[win["status"] == "done"]
    per = {
        f"{m}/{c}": {"n": len(g), "latency": _ref_lat(g)}
        for (m, c), g in done.groupby(["model", "cls"], observed=True, sort=True)
    }
    by_class = {}
    for c, g in win.groupby("cls", observed=True, sort=True):
        gd = g[g["status"] == "done"]
        ok = _ref_ok(gd, classes)
        by_class[str(c)] = {
            "n": len(g),
            "done": len(gd),
            "shed": int((g["status"] == "shed").sum()),
            "latency": _ref_lat(gd),
            "goodput_rps": int(ok.sum()) / span,
        }
    return {
        "latency": _ref_lat(done),
        "per_model_class": per,
        "per_class": by_class,
        "goodput_rps": int(_ref_ok(done, classes).sum()) / span,
    }


@st.composite
def frames(draw: st.DrawFn) -> pd.DataFrame:
    n = draw(st.integers(1, 40))
    times = st.floats(0.0, 10.0, allow_nan=False)
    arrival = np.array(draw(st.lists(times, min_size=n, max_size=n)))
    ttft = np.array(draw(st.lists(times, min_size=n, max_size=n)))
    dec = np.array(draw(st.lists(times, min_size=n, max_size=n)))
    codes = st.lists(st.integers(0, 1), min_size=n, max_size=n)
    return pd.DataFrame(
        {
            "model": pd.Categorical.from_codes(draw(codes), categories=MODELS),
            "cls": pd.Categorical.from_codes(
                draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)), categories=CLASSES
            ),
            "arrival": arrival,
            "first_token": arrival + ttft,
            "end": arrival + ttft + dec,
            "input_tokens": np.array(
                draw(st.lists(st.integers(1, 99), min_size=n, max_size=n)), dtype=np.int32
            ),
            "output_tokens": np.array(
                draw(st.lists(st.integers(1, 9), min_size=n, max_size=n)), dtype=np.int32
            ),
            "status": pd.Categorical.from_codes(
                draw(st.lists(st.integers(0, 4), min_size=n, max_size=n)), categories=STATUS
            ),
        }
    )


slo = st.one_of(st.none(), st.floats(0.1, 20.0))


@settings(max_examples=60, deadline=None)
@given(
    df=frames(),
    w0=st.floats(0.0, 5.0),
    width=st.floats(0.5, 10.0),
    limits=st.lists(st.tuples(slo, slo, slo), min_size=2, max_size=2),
)
def test_summary_matches_the_frame_reference(df, w0, width, limits) -> None:
    """Latency percentiles per model/class and per class, shed counts and goodput equal the
    frame-filter/groupby reference exactly (a class without objectives is never met), with
    the same key order."""
    classes = {
        c: {"e2e": e, "ttft": t, "tpot": p}
        for c, (e, t, p) in zip(CLASSES[:2], limits, strict=True)
    }
    got = summarize(df, Metrics(len(df)), 20.0, classes, {}, (w0, w0 + width))
    want = _round(_reference(df, w0, w0 + width, classes))
    for key in ("latency", "per_model_class", "goodput_rps"):
        assert json.dumps(got[key]) == json.dumps(want[key])
    assert list(got["per_class"]) == list(want["per_class"])
    for c, v in want["per_class"].items():
        for k in ("n", "done", "shed", "latency", "goodput_rps"):
            assert json.dumps(got["per_class"][c][k]) == json.dumps(v[k])
    # per-user speed against a request-by-request loop
    arr = df["arrival"].to_numpy()
    done = df[(arr >= w0) & (arr <= w0 + width) & (df["status"] == "done").to_numpy()]
    speeds = [
        (o - 1) / (e - f)
        for f, e, o in zip(done["first_token"], done["end"], done["output_tokens"], strict=True)
        if o > 1 and e > f
    ]
    us = got["user_tokens_per_s"]
    if not speeds:
        assert us == {"p50": None, "p10": None, "p1": None, "mean": None}
    else:
        srt = sorted(speeds)
        assert us["mean"] == pytest.approx(sum(speeds) / len(speeds), rel=1e-8)
        # (figures are rounded to 9 significant digits)
        assert min(srt) * (1 - 1e-8) <= us["p1"] <= us["p10"] <= us["p50"] <= max(srt) * (1 + 1e-8)
        mid = len(srt) // 2
        median = srt[mid] if len(srt) % 2 else (srt[mid - 1] + srt[mid]) / 2
        assert us["p50"] == pytest.approx(median, rel=1e-8)


def test_user_speed_by_hand() -> None:
    """Three done requests: 5 tokens with 2 s after the first (4 tokens / 2 s = 2 tok/s), 3
    tokens with 0.5 s after the first (2 / 0.5 = 4 tok/s), and one of a single token (no
    decode phase: not counted). Median 3, mean 3; p10 = 2 + 0.1 x (4 - 2) = 2.2 and p1 = 2.02
    (linear interpolation between the two)."""
    df = pd.DataFrame(
        {
            "model": pd.Categorical.from_codes([0, 0, 0], categories=MODELS),
            "cls": pd.Categorical.from_codes([0, 0, 0], categories=CLASSES),
            "arrival": [0.0, 1.0, 1.5],
            "first_token": [1.0, 2.0, 1.7],
            "end": [3.0, 2.5, 1.7],
            "input_tokens": np.array([8, 8, 8], dtype=np.int32),
            "output_tokens": np.array([5, 3, 1], dtype=np.int32),
            "status": pd.Categorical.from_codes([1, 1, 1], categories=STATUS),
        }
    )
    got = summarize(df, Metrics(3), 4.0, {"high": dict.fromkeys(("e2e", "ttft", "tpot"))}, {})
    want = {"p50": 3.0, "p10": 2.2, "p1": 2.02, "mean": 3.0}
    for key in (got["user_tokens_per_s"], got["per_class"]["high"]["user_tokens_per_s"]):
        assert key == pytest.approx(want, rel=1e-12)
