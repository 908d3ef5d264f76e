"""Compatibility of numba-cuda with the installed numpy, applied before numba.cuda is imported.

numba-cuda (0.30) and numba (0.68) register an overload of ``np.row_stack`` when their array
module loads; NumPy 2.5 removed ``row_stack`` (deprecated since 2.0 as an alias of ``vstack``), so
on NumPy 2.5 ``import numba.cuda`` fails with AttributeError and no cuda kernel can compile (seen
on the H200 device image, numpy 2.5.2). :func:`patch_numpy` restores the alias when it is
missing; it changes nothing on a NumPy that still has it."""
from __future__ import annotations

import numpy as np


def patch_numpy() -> None:
    """Make ``np.row_stack`` the alias of ``np.vstack`` it was, where this NumPy lacks it."""
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack


patch_numpy()
