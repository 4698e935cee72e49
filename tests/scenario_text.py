"""Scenario YAML the CLI and study tests write: one small decoder on two servers, a dozen
Poisson requests (about 0.1 s a run)."""

from __future__ import annotations

from collections.abc import Mapping

_BASE = """\
name: {name}
profile: a100-80gb
deployments:
  - model: llama-2-7b
cluster:
  servers: 2
  param_servers: 2
  gpu: {{weight_cache_fraction: 0.4}}
  server: {{host: 64GiB}}
  replica: {{max_num_seqs: 16}}
workload:
  kind: poisson
  requests: 12
  rate: 20
  input_tokens: {{dist: lognormal, mean: 128, sigma: 0.5, low: 8, high: 512}}
  output_tokens: {{dist: lognormal, mean: 8, sigma: 0.5, low: 2, high: 32}}
"""
_CLASSES = """\
  classes:
    - {name: high, share: 0.5, slo: 2s}
    - {name: normal, share: 0.5, slo: 10s}
"""


def tiny_scenario(
    name: str = "tiny",
    *,
    classes: bool = True,
    variants: Mapping[str, Mapping[str, object]] | None = None,
) -> str:
    """The tiny scenario's YAML, named ``name``; with ``classes``, two request classes (high:
    SLO 2 s, normal: 10 s, half the requests each); ``variants``: variant name -> the
    dotted fields it sets and their values, in order."""
    text = _BASE.format(name=name) + (_CLASSES if classes else "")
    if variants:
        text += "variants:\n"
        for vname, sets in variants.items():
            fields = ", ".join(f"{key}: {value}" for key, value in sets.items())
            text += f"  - {{name: {vname}, set: {{{fields}}}}}\n"
    return text
