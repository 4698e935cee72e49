"""Profiles with op tables shipped in ``sim/data/profiles/`` and how to load them.

The ``*-vllm`` profiles are imported from aiconfigurator's measured kernel tables
(:mod:`sim.serving.opcost.aic_import`; attribution in ``NOTICE``); the datasheet profiles
(``a100-80gb``, ``h100-sxm``, ``h200-sxm``, ``source: datasheet``) carry no op tables, so
:class:`sim.serving.opcost.OpCostModel` prices every op on them with the roofline.
"""

from __future__ import annotations

#: shipped op-table profiles, by name -> (aiconfigurator system, datasheet base profile)
OP_PROFILES: dict[str, tuple[str, str]] = {
    "h200-sxm-vllm": ("h200_sxm", "h200-sxm"),
    "h100-sxm-vllm": ("h100_sxm", "h100-sxm"),
    "a100-sxm-vllm": ("a100_sxm", "a100-80gb"),
    "b200-sxm-vllm": ("b200_sxm", "h200-sxm"),
}
