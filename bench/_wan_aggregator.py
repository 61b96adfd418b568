"""The aggregator's side of ``bench/wan.py``, run on the aggregator's host (its network
namespace): start the host (SuperLink, sites' keys registered), wait for every site, run plain
Flower FedAvg for ``--flower-rounds`` (none: 0), then the fedshard run of ``--config``, and
write each run's round marks to ``--out`` as JSON.

    python bench/_wan_aggregator.py --config deploy/hosts/federation.yaml --out marks.json [--flower-rounds N]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _deployed_runs import fedshard_rounds, flower_rounds

from fedshard.config import load_federation
from fedshard.deploy.aggregator_host import AggregatorHost


def main() -> int:
    """Run (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--flower-rounds", type=int, default=0)
    args = parser.parse_args()
    config = load_federation(args.config)
    host = AggregatorHost(config)
    try:
        if not host.start():
            raise RuntimeError("stopped while waiting for the sites")
        deadline = time.monotonic() + 300
        while host.poll_nodes() < len(config.sites):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{host.poll_nodes()} of {len(config.sites)} SuperNodes online after 300 s")
            time.sleep(0.5)
        runs = {}
        if args.flower_rounds:
            runs["flower"] = flower_rounds(host, args.config.resolve(), args.out.parent, args.flower_rounds, "wan")
        runs["fedshard"] = fedshard_rounds(host)
        args.out.write_text(json.dumps({name: dataclasses.asdict(run) for name, run in runs.items()}))
    finally:
        host.stop_children()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
