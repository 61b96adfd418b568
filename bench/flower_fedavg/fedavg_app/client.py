"""ClientApp: local training and evaluation of the task, nothing else (no shards, zones, DP)."""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


def _setup(context: Context):  # type: ignore[no-untyped-def]
    import torch

    from fedshard.config import load_federation, load_site
    from fedshard.task import Partition, load_task

    local = load_site(str(context.node_config["site-config"]))
    assert local.deployment is not None
    config = load_federation(local.deployment.federation)
    task = load_task(config.task.target, dict(config.task.options))
    partition = Partition(config.partition_of(local.site.id), config.num_partitions, config.federation.seed)
    torch.manual_seed(config.federation.seed)
    return config, task, task.build_model(), task.load_data(partition)


@app.train()
def train(msg: Message, context: Context) -> Message:
    from fedshard.task import TrainSettings

    config, task, model, data = _setup(context)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    t = config.training
    metrics = task.train(model, data, TrainSettings(t.local_epochs, t.batch_size, t.learning_rate, seed=0))
    content = RecordDict(
        {
            "arrays": ArrayRecord(model.state_dict()),
            "metrics": MetricRecord({"train_loss": metrics.loss, "num-examples": data.num_train}),
        }
    )
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    _, task, model, data = _setup(context)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    metrics = task.evaluate(model, data)
    record = MetricRecord({"loss": metrics.loss, "accuracy": metrics.accuracy or 0.0, "num-examples": data.num_test})
    return Message(content=RecordDict({"metrics": record}), reply_to=msg)
