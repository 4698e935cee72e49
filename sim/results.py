"""The run folder (ARCHITECTURE "Results"): written to a temp folder, renamed at the end.

Layout of ``<root>/<scenario-name>-<config-hash>/``: ``config.yaml`` (resolved scenario and
seed), ``summary.json``, ``requests.parquet``, ``timeseries.parquet``, PNG plots and
``replay.json`` -- for a scenario with variants, ``replay-<variant>.json`` per variant --
(re-run it with ``pdsim replay``). Files and folders get the user's umask. The name
is a hash of the resolved config and seed, so a different run never lands in the same folder;
re-running an identical config replaces the folder with identical content.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml

from sim.scenario import Scenario, config_hash
from sim.study.sweep.resultcache import as_umask


def run_folder_name(sc: Scenario, seed: int) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in sc.name)
    return f"{safe}-{config_hash(sc, seed)}"


def write_run(root: Path, sc: Scenario, seed: int, result: Any) -> Path:
    """Write ``result`` under ``root``; returns the final folder. Nothing half-written: files
    go to a temporary sibling folder that is renamed into place once complete."""
    from sim.study.plots import write_plots

    root.mkdir(parents=True, exist_ok=True)
    final = root / run_folder_name(sc, seed)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        as_umask(tmp, folder=True)
        (tmp / "config.yaml").write_text(yaml.safe_dump(result.config, sort_keys=False), "utf-8")
        (tmp / "summary.json").write_text(
            json.dumps(result.summary, indent=2, sort_keys=False) + "\n", "utf-8"
        )
        result.requests.to_parquet(tmp / "requests.parquet", index=False)
        result.timeseries.to_parquet(tmp / "timeseries.parquet", index=False)
        scaled = getattr(result, "autoscale", None)
        if scaled is not None:
            scaled.to_parquet(tmp / "autoscale.parquet", index=False)
        write_plots(tmp, result)
        # every run can be replayed bit for bit (pdsim replay): the run, or each variant
        from sim.study.recording import run_replay_record, variant_replay_records, write_replay

        if not sc.variants:
            write_replay(tmp / "replay.json", sc, seed, run_replay_record(sc, seed, result))
        for name, rec in variant_replay_records(sc, seed, result).items():
            safe = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in name)
            write_replay(tmp / f"replay-{safe}.json", sc, seed, rec)
        if final.exists():
            old = final.with_name(final.name + ".old")
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def read_summary(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / "summary.json").read_text("utf-8"))
    return data
