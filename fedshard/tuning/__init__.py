"""Private tuning: choose among a few candidate settings on a validation split held out at every
site, with the privacy the choice costs charged to every site's budget (``fedshard tune``).

* :mod:`fedshard.tuning.candidates`: the federation each candidate runs, its budget share;
* :mod:`fedshard.tuning.selection`: each site's noisy validation score and its tuning ledger;
* :mod:`fedshard.tuning.run`: running the candidates and choosing one.
"""

from fedshard.tuning.candidates import CandidateRun, candidate_runs, check_tunable
from fedshard.tuning.run import TUNE_FILE, CandidateResult, tune

__all__ = ["TUNE_FILE", "CandidateResult", "CandidateRun", "candidate_runs", "check_tunable", "tune"]
