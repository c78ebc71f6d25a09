"""llamafast's CLI with tuning's step choice as it was before float and FP8 GEMVs joined it: only a block GEMV's
ways are offered to the step (ways.offered returns nothing for a sweep of one way). For the A/B in run.sh:
    python3 scripts/experiments/float_ways/old_rule.py bench ...
"""
import sys

from llamafast.kernels.gemv import GemvConfig
from llamafast.tuning import ways

new = ways.offered


def offered(s, pdl=False):
    swept = {ways.way(launch) for launch in s.times if isinstance(launch, GemvConfig)}  # attention's sweep: none
    return new(s) if len(swept) > 1 else []


ways.offered = offered

from llamafast.cli import app  # noqa: E402

sys.argv[0] = "llamafast"
app()
