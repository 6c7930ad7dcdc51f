"""`python -m service.synthetic_main`: the demo's synthetic traffic as its own process."""

from __future__ import annotations

import argparse
import contextlib
import logging

from service.synthetic import run_traffic


def main() -> None:
    parser = argparse.ArgumentParser(description="post synthetic agent batches to a faultline service")
    parser.add_argument("--server", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--interval", type=float, default=5.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with contextlib.suppress(KeyboardInterrupt):
        run_traffic(args.server, args.token, nodes=args.nodes, gpus=args.gpus_per_node, interval=args.interval)


if __name__ == "__main__":
    main()
