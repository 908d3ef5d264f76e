"""Test helpers for schedule knobs."""
from __future__ import annotations


class Fixed:
    """Tuning stand-in for ``compiler.lower.lower_graph(..., tuning=)``: the same knob values
    (name -> value) for every workload; a knob a workload does not declare is ignored, and a
    value outside a knob's candidates leaves its default (``ir.knobs.KnobConfig``)."""

    def __init__(self, knobs: dict):
        self.knobs = knobs

    def knobs_for(self, key):
        return dict(self.knobs)
