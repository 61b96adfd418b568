"""Differential privacy: DP events, accountants, the per-site budget ledger, DP-SGD and update-level DP."""
