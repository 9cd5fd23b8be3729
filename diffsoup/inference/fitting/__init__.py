"""Fitting a lowered study: optimizers (fides, TRF, L-BFGS-B), start points and samplers,
analytic (hierarchical) parameters, profile likelihoods and the pyPESTO bridge."""
