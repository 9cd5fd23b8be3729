"""The Hessians an optimizer of a fit can run on: one vocabulary, read by ``Fides``, the pyPESTO
bridge, the study file's ``[fit] hessian`` and the command's ``--hessian``.

This module imports nothing, so the command line can offer its choices without loading JAX.

Two vocabularies are easily confused, so they carry different names:

- :data:`FIDES_HESSIANS` (here): *which matrix* the optimizer's quadratic model uses: a matrix
  the lowered study evaluates (``"gauss_newton"``, ``"exact"``) or one the optimizer builds
  itself from those or from gradients (``"hybrid"``, ``"bfgs"``, ``"sr1"``);
- ``HESSIAN_COMPUTATIONS`` (``diffsoup.inference.objective._lower``, ``ds.lower(hessian=...)``):
  *how* the lowered study computes the exact Hessian (``"exact"`` forward over reverse, ``"fd"``
  central differences of gradients, ``"auto"``).
"""

from __future__ import annotations

# fides' Hessians (``ds.inference.Fides(hessian=...)``), in the order the command lists them.
FIDES_HESSIANS = ("gauss_newton", "hybrid", "exact", "bfgs", "sr1")
DEFAULT_HESSIAN = "gauss_newton"
# Those the optimizer updates itself (``"hybrid"`` starts from Gauss-Newton, then BFGS updates).
QUASI_NEWTON_HESSIANS = ("hybrid", "bfgs", "sr1")
# Those the lowered study hands over as a matrix: what a pyPESTO objective can return.
PYPESTO_HESSIANS = tuple(h for h in FIDES_HESSIANS if h not in QUASI_NEWTON_HESSIANS)
