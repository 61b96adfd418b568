"""The centrally trained, non-federated baseline: the same model, seed and training
settings on the union of every site's data, for comparison with the federated model."""

from __future__ import annotations

from fedshard.config import FederationConfig, local_batch
from fedshard.task import Metrics, Partition, TrainSettings, load_task

__all__ = ["centralized_baseline"]


def centralized_baseline(config: FederationConfig, rounds: int | None = None) -> Metrics:
    """Train once on all the data for ``rounds * local_epochs`` epochs and evaluate on all test data."""
    import torch

    task = load_task(config.task.target, dict(config.task.options))
    data = task.load_data(Partition(None, config.num_partitions, config.federation.seed))
    torch.manual_seed(config.federation.seed)
    model = task.build_model()
    t = config.training
    epochs = (rounds or config.federation.rounds) * t.local_epochs
    batch = local_batch(t.sent_batch_size, data.num_train)
    task.train(model, data, TrainSettings(epochs, batch, t.learning_rate, config.federation.seed))
    return task.evaluate(model, data)
