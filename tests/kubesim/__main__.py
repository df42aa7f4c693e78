"""Command line: `python -m kubesim serve --port 0 --kubeconfig OUT --root DIR`.

Runs one cluster in the foreground until SIGTERM/SIGINT. A full configuration (nodes, images,
time scale) comes from `--config FILE` (SimConfig JSON, as the fixture writes it).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from kubesim.config import NodeSpec, SimConfig


def _node(text: str) -> NodeSpec:
    name, _, gpus = text.partition(":")
    if not name or (gpus and not gpus.isdigit()):
        raise argparse.ArgumentTypeError(f"--node {text!r}: use NAME or NAME:GPUS, e.g. gpu-1:2")
    return NodeSpec(name, gpus=int(gpus or 0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kubesim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run a cluster on loopback")
    serve.add_argument("--port", type=int, default=0, help="0 picks a free port")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--kubeconfig", type=Path, help="write a kubeconfig for the server here")
    serve.add_argument("--root", type=Path, help="folder for logs, volumes and state")
    serve.add_argument("--config", type=Path, help="SimConfig JSON (overrides --root/--node)")
    serve.add_argument("--node", type=_node, action="append", help="NAME[:GPUS], repeatable")
    serve.add_argument("--time-scale", type=float, default=1.0)
    args = parser.parse_args(argv)
    if args.config is not None:
        config = SimConfig.from_json(args.config.read_text())
    elif args.root is not None:
        config = SimConfig(root=args.root, nodes=tuple(args.node or [NodeSpec("node-1")]),
                           time_scale=args.time_scale)
    else:
        parser.error("serve needs --root DIR (or --config FILE)")
    config.root.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from kubesim.server import run  # aiohttp loads only once the arguments are good

    run(config, args.host, args.port, args.kubeconfig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
