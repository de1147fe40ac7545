"""Naming what holds a leak: holder paths as data (``paths``), the edges and roots they are made of
(``edges``), the search for them (``referrers``), tensors grouped and named (``snapshot``), the
diagnoses read from them (``diagnosis``) and the pipeline whole-test and step checks share (``naming``)."""

from .diagnosis import RULES, SOLE_RULES, Rule, diagnose
from .edges import NamedRoot
from .paths import Edge, EdgeKind, HolderPath, Root, RootKind

__all__ = ["RULES", "SOLE_RULES", "Edge", "EdgeKind", "HolderPath", "NamedRoot", "Root", "RootKind", "Rule", "diagnose"]
