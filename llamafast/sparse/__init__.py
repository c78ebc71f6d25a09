"""Router-sparse FFN: calibration on the user's own frozen weights (calibrate.py, what `llamafast sparsify` writes),
and the same parts with an exact sparsity for random weights (exact.py, speed work without a checkpoint).

Per layer, from the normed FFN inputs h of the calibration text (the model's weights never change):
1. groups: balanced k-means of the neurons by co-activation (each neuron's |SiLU(gate) * up| over the tokens,
   unit length, cosine similarity), exactly G neurons per group, so that a group tends to be idle as a whole;
2. the permutation that makes each group contiguous rows of w1, w3 and of w2t (w2 transposed);
3. a router in LTE's form, one sigmoid score per group from a linear map of h, fitted (ridge regression, closed
   form, deterministic) to the log of the group's contribution norm ||SiLU(g) * u @ W2t[group]|| per token;
4. thresholds at every level of SPARSE_LEVELS: the quantiles of the router scores (router mode) and of the
   groups' |SiLU(gate)| mass (gate mode, CATS-style) over the calibration tokens, so a run can pick any sparsity.
"""

from llamafast.sparse.calibrate import (  # noqa: F401
    MIN_TOKENS,
    LayerPlan,
    balanced_assign,
    balanced_groups,
    calibrate_layer,
    ffn_inputs,
    permuted,
    quantile_table,
    ridge,
)
from llamafast.sparse.exact import dense_state, exact_parts, exact_sparse_state  # noqa: F401
