"""A tiny scenario (one small decoder, a handful of requests; ~0.1 s per run)."""

from __future__ import annotations

from pathlib import Path

import pytest

TINY = """\
name: tiny
profile: a100-80gb
deployments:
  - model: llama-2-7b
cluster:
  servers: 2
  param_servers: 2
  gpu: {weight_cache_fraction: 0.4}
  server: {host: 64GiB}
  replica: {max_num_seqs: 16}
workload:
  kind: poisson
  requests: 12
  rate: 20
  input_tokens: {dist: lognormal, mean: 128, sigma: 0.5, low: 8, high: 512}
  output_tokens: {dist: lognormal, mean: 8, sigma: 0.5, low: 2, high: 32}
  classes:
    - {name: high, share: 0.5, slo: 2s}
    - {name: normal, share: 0.5, slo: 10s}
variants:
  - {name: big, set: {cluster.servers: 4}}
"""


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    """Path of the tiny scenario file (in a fresh temporary folder)."""
    p = tmp_path / "tiny.yaml"
    p.write_text(TINY, encoding="utf-8")
    return p
