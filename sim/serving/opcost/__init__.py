"""The op-level cost model: an iteration as a list of per-GPU ops timed from a profile's
measured op tables (interpolated) or, where no table covers an op, a stated roofline.

Public surface: :class:`OpCostModel` (``iteration_time``, ``iteration_ops``,
``iteration_breakdown``), the table schema (:class:`OpsProfile` and its parts),
:class:`DecoderShape` (the shipped op-table profiles load with :func:`sim.serving.costmodel.load_profile`).
"""

from sim.serving.opcost.iteration import OP_NAMES, OpCost, OpCostModel
from sim.serving.opcost.shapes import DecoderShape
from sim.serving.opcost.tables import (
    AttentionTable,
    CollectiveTable,
    Curves,
    ElementwiseTable,
    GemmTable,
    Grid3,
    OpsProfile,
    TableOrigin,
)
from sim.serving.opcost.terms import EngineTerms, RooflineTerms

__all__ = [
    "OP_NAMES",
    "AttentionTable",
    "CollectiveTable",
    "Curves",
    "DecoderShape",
    "ElementwiseTable",
    "EngineTerms",
    "GemmTable",
    "Grid3",
    "OpCost",
    "OpCostModel",
    "OpsProfile",
    "RooflineTerms",
    "TableOrigin",
]
