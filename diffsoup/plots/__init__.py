"""PNG figures of fits and simulations (matplotlib, drawn off-screen): each experiment's model
against its data, the multistart waterfall, the parameter estimates with standard errors, and
profile likelihoods with their confidence intervals."""

from ._figures import plot_estimates as plot_estimates
from ._figures import plot_fits as plot_fits
from ._figures import plot_waterfall as plot_waterfall
from ._profiles import plot_profiles as plot_profiles
