"""Private tuning: choose among a few candidate settings on a validation split held out at every
site, with the privacy the choice costs charged to every site's budget (``fedshard tune``).

* :mod:`fedshard.tuning.candidates`: the federation each candidate runs;
* :mod:`fedshard.tuning.budget`: every site's budget split between the candidates' training and the scores;
* :mod:`fedshard.tuning.selection`: each site's noisy validation score and its tuning ledger;
* :mod:`fedshard.tuning.run`: running the candidates and choosing one.
"""

from fedshard.tuning.budget import BudgetSplit, split_budget
from fedshard.tuning.candidates import CandidateRun, TuningPlan, candidate_runs, check_tunable
from fedshard.tuning.run import TUNE_FILE, CandidateResult, tune

__all__ = [
    "TUNE_FILE",
    "BudgetSplit",
    "CandidateResult",
    "CandidateRun",
    "TuningPlan",
    "candidate_runs",
    "check_tunable",
    "split_budget",
    "tune",
]
