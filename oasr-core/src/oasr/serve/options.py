"""The flags of ``oasr serve`` and the (EngineConfig, ServerSettings) they make.

Shared by the in-process server (:mod:`oasr.serve.cli`) and Ray Serve (:mod:`oasr.ray.serve`).
Imports no web framework.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

#: the EngineConfig fields ``oasr serve`` takes as flags (see :mod:`oasr.engine.flags`), by group
ENGINE_FIELDS = ("model", "architecture")
SERVER_ENGINE_FIELDS = ("max_audio_seconds",)
BATCHING_FIELDS = ("device", "dtype", "quantization", "max_batch_size", "max_batch_frames", "max_wait_time",
                   "schedule_policy", "decode_method")
STREAMING_FIELDS = ("chunk_size", "num_left_chunks", "max_streams", "max_stream_seconds")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from oasr.engine.flags import add_engine_flags

    add_engine_flags(parser, ENGINE_FIELDS)

    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="interface to bind (default: 127.0.0.1, loopback only)")
    server.add_argument("--port", type=int, default=8000)
    server.add_argument("--api-key", default=os.environ.get("OASR_API_KEY"),
                        help="require 'Authorization: Bearer KEY' on /v1/* (default: $OASR_API_KEY; none: open)")
    server.add_argument("--served-model-name", action="extend", nargs="+", default=None, metavar="NAME",
                        help="names clients may pass as 'model', the first listed by /v1/models (several, as "
                             "vLLM's flag: e.g. --served-model-name tiny.en whisper-1 for OpenAI's examples; "
                             "default: the --model id, or a local directory's name); any other name gets 404")
    server.add_argument("--max-upload-mb", type=float, default=25.0, help="largest audio upload (default: 25, as OpenAI)")
    add_engine_flags(server, SERVER_ENGINE_FIELDS)
    server.add_argument("--max-concurrency", type=int, default=64,
                        help="requests in flight at once; more get 429 (there is no unbounded queue)")
    server.add_argument("--max-pending-uploads", type=int, default=128,
                        help="request bodies received at once; more get 429 (a concurrency slot is taken only "
                             "once the body has arrived)")
    server.add_argument("--body-timeout", type=float, default=120.0,
                        help="seconds a request body may take to arrive (408 after)")
    server.add_argument("--header-timeout", type=float, default=10.0,
                        help="seconds a connection may take to send a complete request head (closed after)")
    server.add_argument("--request-timeout", type=float, default=600.0, help="abort a request after this many seconds")
    server.add_argument("--shutdown-grace", type=float, default=30.0,
                        help="seconds in-flight requests get to finish on shutdown")
    server.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    server.add_argument("--no-access-log", action="store_true", help="do not log each request")

    engine = parser.add_argument_group("engine")
    add_engine_flags(engine, BATCHING_FIELDS)
    engine.add_argument("--decode-option", action="append", default=[], metavar="KEY=VALUE",
                        help="decode strategy option (VALUE parsed as JSON when it is JSON); repeatable")
    add_engine_flags(engine, ("num_threads",))

    scale = parser.add_argument_group("scale-out on Ray Serve (pip install \"oasr-core[ray]\")")
    scale.add_argument("--ray", action="store_true",
                       help="serve through Ray Serve: --replicas copies of the app, one engine each")
    scale.add_argument("--replicas", type=int, default=1, help="Ray Serve replicas (with --ray)")
    scale.add_argument("--replica-cpus", type=float, default=1.0, help="CPUs each replica reserves (with --ray)")
    scale.add_argument("--replica-gpus", type=float, default=0.0,
                       help="GPUs (or a fraction) each replica reserves (with --ray)")
    scale.add_argument("--ray-address", default=None,
                       help="a running Ray cluster to join (default: start a local one)")

    streaming = parser.add_argument_group("streaming")
    streaming.add_argument("--streaming", action="store_true",
                           help="run the streaming engine (natively streaming models): partial results on "
                                "stream=true and on the realtime WebSocket")
    add_engine_flags(streaming, STREAMING_FIELDS)


def _decode_options(pairs: list[str]) -> dict[str, Any]:
    from oasr.errors import ConfigError

    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--decode-option expects KEY=VALUE, got {pair!r}", key="decode_option")
        try:
            options[key] = json.loads(raw)
        except json.JSONDecodeError:
            options[key] = raw
    return options


def build_configs(args: argparse.Namespace):
    """(EngineConfig, ServerSettings) from parsed arguments; a bad value raises ConfigError."""
    from oasr.engine import EngineConfig
    from oasr.engine.flags import engine_config_kwargs
    from oasr.errors import ConfigError
    from oasr.serve.settings import ServerSettings

    try:
        fields = (*ENGINE_FIELDS, *SERVER_ENGINE_FIELDS, *BATCHING_FIELDS, "num_threads", *STREAMING_FIELDS)
        config = EngineConfig(
            **engine_config_kwargs(args, fields), service_mode="streaming" if args.streaming else "offline",
            max_queue=args.max_concurrency, decode_options=_decode_options(args.decode_option))
        settings = ServerSettings(
            served_model_names=tuple(args.served_model_name or ()), api_key=args.api_key or None,
            max_upload_bytes=int(args.max_upload_mb * 2**20), max_concurrency=args.max_concurrency,
            request_timeout=args.request_timeout, shutdown_grace=args.shutdown_grace,
            max_pending_uploads=args.max_pending_uploads, body_timeout=args.body_timeout,
            header_timeout=args.header_timeout)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"invalid server option: {exc}") from None
    return config, settings
