"""Study-generic statistics on a long score table (one row per prompt).

Building blocks: unit-level exclusion, grouped means of any score column, a bootstrap interval
over units, the structured permutation test of an in-group gap, and matrix z-scores with
cell-wise paired t-tests, the number of units a significant result needs (power), and the
sign-flip test over units with Holm's adjustment of a family of tests.
Study metrics (e.g. `probekit.studies.intergroup.metrics`) compose them.
"""

from probekit.stats.bootstrap import (
    BootstrapResult,
    bootstrap_ci,
    bootstrap_mean,
    bootstrap_units,
    mean_ratio,
)
from probekit.stats.exclusion import Exclusion, exclude_units, low_valid_mass, unparsed
from probekit.stats.family import holm, paired_effect_size, sign_flip_test
from probekit.stats.grouped import grouped_means, score_cube
from probekit.stats.matrix import cell_pvalues, shown_mask, zscore
from probekit.stats.permutation import PermutationResult, empathy_gap, permutation_test
from probekit.stats.power import PowerCurve, units_for_power
from probekit.stats.table import require_columns, select_rows

__all__ = [
    "BootstrapResult",
    "Exclusion",
    "PermutationResult",
    "PowerCurve",
    "bootstrap_ci",
    "bootstrap_mean",
    "bootstrap_units",
    "cell_pvalues",
    "empathy_gap",
    "exclude_units",
    "grouped_means",
    "holm",
    "low_valid_mass",
    "mean_ratio",
    "paired_effect_size",
    "permutation_test",
    "require_columns",
    "score_cube",
    "select_rows",
    "shown_mask",
    "sign_flip_test",
    "unparsed",
    "units_for_power",
    "zscore",
]
