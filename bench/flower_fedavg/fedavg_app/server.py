"""ServerApp: Flower's FedAvg for the configured rounds (or the run config's ``rounds``), every site
training and evaluating."""

from __future__ import annotations

import json
import time

from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    import torch
    from flwr.serverapp.strategy import FedAvg

    from fedshard.config import load_federation
    from fedshard.task import load_task

    config = load_federation(str(context.run_config["config"]))
    times = str(context.run_config["times"])
    rounds = int(str(context.run_config.get("rounds", "") or config.federation.rounds))
    task = load_task(config.task.target, dict(config.task.options))
    torch.manual_seed(config.federation.seed)
    n = len(config.sites)
    strategy = FedAvg(
        fraction_train=1.0, fraction_evaluate=1.0, min_train_nodes=n, min_evaluate_nodes=n, min_available_nodes=n
    )

    def mark(server_round: int, arrays: ArrayRecord) -> None:
        # called once before round 1 and once after each round's train + evaluate
        with open(times, "a") as fh:
            fh.write(json.dumps({"round": server_round, "at": time.time()}) + "\n")

    result = strategy.start(grid, ArrayRecord(task.build_model().state_dict()), num_rounds=rounds, evaluate_fn=mark)
    with open(times, "a") as fh:
        metrics = {r: dict(m) for r, m in result.evaluate_metrics_clientapp.items()}
        fh.write(json.dumps({"done": True, "metrics": metrics}) + "\n")
