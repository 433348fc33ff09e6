"""``oasr serve`` on Ray Serve: one engine per replica behind Ray Serve's FastAPI ingress.

Each replica builds the same FastAPI app as in-process ``oasr serve`` (:func:`oasr.serve.app.create_app`):
its engine loads once per replica at start-up (a local path, or a hub id through the hub cache), and it
serves the same routes — the OpenAI-compatible audio endpoints with SSE, ``WS /v1/realtime``, health,
readiness and metrics — through Ray Serve's HTTP proxy.  Batching stays inside each replica's engine.

From the command line: ``oasr serve --ray --replicas N [--replica-cpus C] [--replica-gpus G]``.  With
``serve run`` (a Ray Serve config), name the application builder and pass ``oasr serve`` flags as args::

    # serve_config.yaml
    applications:
      - name: oasr
        route_prefix: /
        import_path: oasr.ray.serve:app_builder
        args: {model: whisper-tiny.en, replicas: 2, replica_cpus: 1, max_batch_size: 16}

    serve run serve_config.yaml
"""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any

from oasr.ray.requirement import require_ray


def deployment(config: Any, settings: Any, *, replicas: int = 1, autoscaling: dict[str, Any] | None = None,
               replica_cpus: float = 1.0, replica_gpus: float = 0.0, name: str = "oasr"):
    """A bound Ray Serve application: ``replicas`` copies (or ``autoscaling``, Ray Serve's
    ``autoscaling_config``) of the app around an engine of ``config`` (EngineConfig) and ``settings``
    (ServerSettings), each replica reserving ``replica_cpus`` CPUs and ``replica_gpus`` GPUs."""
    require_ray("serve")
    from ray import serve

    def build_app():
        from oasr.serve.app import create_app

        return create_app(config, settings)

    options: dict[str, Any] = {"name": name, "ray_actor_options": {"num_cpus": replica_cpus, "num_gpus": replica_gpus}}
    if autoscaling:
        options["autoscaling_config"] = autoscaling
    else:
        options["num_replicas"] = replicas
    return serve.deployment(serve.ingress(build_app)(), **options).bind()


def app_builder(args: dict[str, Any]):
    """The application builder for ``serve run``: ``args`` are ``oasr serve`` flags (underscores or
    dashes; ``replicas``, ``replica_cpus``, ``replica_gpus`` included) plus ``autoscaling``, a Ray Serve
    ``autoscaling_config``."""
    from oasr.serve.options import add_arguments, build_configs

    parser = argparse.ArgumentParser(prog="oasr serve")
    add_arguments(parser)
    argv: list[str] = []
    for key, value in args.items():
        if key == "autoscaling":
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value not in (False, None):
            argv += [flag, str(value)]
    parsed, unknown = parser.parse_known_args(argv)
    if unknown:
        from oasr.errors import ConfigError

        raise ConfigError(f"unknown oasr serve option(s) in the application args: {' '.join(unknown)}", key="args")
    config, settings = build_configs(parsed)
    return deployment(config, settings, replicas=parsed.replicas, autoscaling=args.get("autoscaling"),
                      replica_cpus=parsed.replica_cpus, replica_gpus=parsed.replica_gpus)


def start(config: Any, settings: Any, *, host: str = "127.0.0.1", port: int = 8000, replicas: int = 1,
          replica_cpus: float = 1.0, replica_gpus: float = 0.0, ray_address: str | None = None,
          autoscaling: dict[str, Any] | None = None) -> None:
    """Start (or join) a Ray cluster and run the deployment on ``host:port`` (returns once it is up)."""
    ray = require_ray("serve")
    from ray import serve

    if not ray.is_initialized():
        ray.init(address=ray_address, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": host, "port": port})
    serve.run(deployment(config, settings, replicas=replicas, autoscaling=autoscaling, replica_cpus=replica_cpus,
                         replica_gpus=replica_gpus), name="oasr", route_prefix="/")


def run_cli(args: argparse.Namespace) -> int:
    """``oasr serve --ray``: serve until interrupted, then shut the deployment down."""
    from oasr.serve.options import build_configs

    config, settings = build_configs(args)
    start(config, settings, host=args.host, port=args.port, replicas=args.replicas, replica_cpus=args.replica_cpus,
          replica_gpus=args.replica_gpus, ray_address=args.ray_address)
    print(f"oasr: serving on Ray Serve ({args.replicas} replica(s)) at http://{args.host}:{args.port}/v1 "
          f"(Ctrl-C stops)", file=sys.stderr, flush=True)
    stop = threading.Event()
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        from ray import serve

        serve.shutdown()
    return 0
