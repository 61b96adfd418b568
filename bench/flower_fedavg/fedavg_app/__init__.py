"""Plain Flower FedAvg on fedshard's example task (benchmark baseline)."""
