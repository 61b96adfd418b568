"""The same update through Flower's own message transport, for ``bench/upload.py``.

A Flower ``ServerApp``/``ClientApp`` pair on Flower's simulation runtime
(``flwr.simulation.run_simulation``, one SuperNode, Ray backend): the ServerApp sends the
ClientApp a ``train`` message; the ClientApp replies with the update as one
``ArrayRecord`` (one ``Array`` per layer, as Flower carries model weights), or with an
empty ``RecordDict`` when asked for an empty reply. The ServerApp times each round trip
(``push_messages``, then ``pull_messages`` every millisecond until the reply is there,
including the reply's deserialisation into ``Array`` s), alternating update and empty
replies; the transfer time of the update is the median update round trip minus the median
empty round trip, so the fixed costs of a message (scheduling the ClientApp on its actor,
polling) are not charged to the bytes. The ClientApp builds the update once per actor,
before its first reply (an untimed warm-up round trip of each kind comes first).

Run as ``python bench/_flower_transfer.py VALUES REPS OUT.json`` (a separate process: Ray
and Flower's logging stay out of the caller).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")

sys.path.insert(0, str(Path(__file__).resolve().parent))

_UPDATE: dict[str, np.ndarray] = {}


def _update(values: int) -> dict[str, np.ndarray]:
    """The benchmark's update (``_common.synthetic_update``), built once per ClientApp actor."""
    if not _UPDATE:
        import _common as c

        _UPDATE.update(c.synthetic_update(values))
    return _UPDATE


def client_app() -> Any:
    """Replies to ``train`` with the update as an ``ArrayRecord``, or empty."""
    from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.train()  # type: ignore[misc]
    def train(msg: Message, context: Context) -> Message:
        config = msg.content["config"]
        update = _update(int(config["values"]))
        if not int(config["full"]):
            return Message(content=RecordDict(), reply_to=msg)
        record = ArrayRecord({k: Array(v) for k, v in update.items()})
        return Message(content=RecordDict({"update": record}), reply_to=msg)

    return app


def server_app(values: int, reps: int, out: Path) -> Any:
    """Times ``reps`` update and empty round trips, alternating; writes them to ``out``."""
    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
    from flwr.serverapp import Grid, ServerApp

    app = ServerApp()

    @app.main()  # type: ignore[misc]
    def main(grid: Grid, context: Context) -> None:
        while not (nodes := list(grid.get_node_ids())):
            time.sleep(0.05)
        node = nodes[0]

        def round_trip(full: bool) -> tuple[float, int]:
            config = ConfigRecord({"values": values, "full": int(full)})
            msg = Message(content=RecordDict({"config": config}), dst_node_id=node, message_type=MessageType.TRAIN)
            t0 = time.perf_counter()
            pending = {mid for mid in grid.push_messages([msg]) if mid}
            replies: list[Message] = []
            while pending:
                got = list(grid.pull_messages(pending))
                for reply in got:
                    pending.discard(reply.metadata.reply_to_message_id)
                replies += got
                if pending:
                    time.sleep(0.001)
            elapsed = time.perf_counter() - t0
            (reply,) = replies
            if reply.has_error():
                raise RuntimeError(f"the ClientApp failed: {reply.error.reason}")
            nbytes = sum(a.numpy().nbytes for a in reply.content["update"].values()) if full else 0
            return elapsed, nbytes

        round_trip(False)
        round_trip(True)
        full: list[float] = []
        empty: list[float] = []
        nbytes = 0
        for _ in range(reps):
            t, nbytes = round_trip(True)
            full.append(t)
            empty.append(round_trip(False)[0])
        out.write_text(json.dumps({"full": full, "empty": empty, "bytes": nbytes}))

    return app


def measure(values: int, reps: int, out: Path) -> dict[str, Any]:
    """Run the pair on the simulation runtime; the round trips (seconds) and the bytes carried."""
    from flwr.simulation import run_simulation

    run_simulation(
        server_app=server_app(values, reps, out),
        client_app=client_app(),
        num_supernodes=1,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": os.cpu_count() or 1, "num_gpus": 0, "include_dashboard": False},
        },
    )
    result: dict[str, Any] = json.loads(out.read_text())
    full, empty = statistics.median(result["full"]), statistics.median(result["empty"])
    result["transfer_s"] = max(full - empty, 1e-9)
    return result


if __name__ == "__main__":
    n, r, path = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    path.unlink(missing_ok=True)
    measure(n, r, path)
    print(path.read_text())
