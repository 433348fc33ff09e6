"""``oasr serve``: run the OpenAI-compatible HTTP/WebSocket server on one model.

The model loads before the server binds, so a bad ``--model`` fails at once with a clear error.
SIGINT/SIGTERM stop accepting connections; in-flight requests get ``--shutdown-grace`` seconds.
This module imports no web framework until :func:`run` (``oasr --help`` stays fast).
"""

from __future__ import annotations

import argparse
import sys

from oasr.serve.options import add_arguments, build_configs

__all__ = ["add_arguments", "build_configs", "run"]


def run(args: argparse.Namespace) -> int:
    if args.ray:
        from oasr.ray.serve import run_cli

        return run_cli(args)
    from oasr.engine import Engine
    from oasr.serve.app import create_app
    from oasr.serve.server import OasrServer, uvicorn_config

    config, settings = build_configs(args)
    engine = Engine(config)
    app = create_app(engine, settings)
    names = ", ".join(app.state.oasr.model_names)
    print(f"oasr: serving {names} ({engine.loaded.architecture}, {engine.decode_method}, {config.service_mode}) "
          f"on http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    server = OasrServer(uvicorn_config(app, settings, host=args.host, port=args.port, log_level=args.log_level,
                                       access_log=not args.no_access_log))
    server.run()
    return 0
