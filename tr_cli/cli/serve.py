"""`tr serve`: the OpenAI HTTP API on a local port, every request decoded with Token Recycling.

The port is bound before the model loads (a port in use fails at once) and listened on once the
model is ready. uvicorn serves tr_cli/serve's app on a thread of its own; the main thread decodes
(torch runs fastest on the thread that loaded the model, see serve/worker.py). SIGINT, SIGTERM
and SIGHUP stop both: new and queued requests are refused, the running one stops between two steps, the
responses end, the hot state is saved, exit 0. A second Ctrl-C stops waiting for open connections.
"""

from __future__ import annotations

import ipaddress
import logging
import signal
import socket
import sys
import threading
import time
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Annotated

import typer

from ..core.wording import counted
from ..engine.options import DecodingOptions
from ..errors import UserError
from ..models.resolve import DEFAULT_MODEL
from .console import note, warn
from .interrupts import TERMINATING_SIGNALS, handling
from .options import decoding_options

if TYPE_CHECKING:  # uvicorn, FastAPI and torch load when the server starts, not for --help
    import uvicorn

    from ..serve.worker import DecodeWorker

Host = Annotated[str, typer.Option("--host", help="Address to listen on (loopback by default: this machine only).")]
Port = Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to listen on (0: any free port).")]
ApiKey = Annotated[
    str | None,
    typer.Option(
        "--api-key", envvar="TR_API_KEY", help="Require 'Authorization: Bearer KEY' on /v1 (also: TR_API_KEY)."
    ),
]
QueueSize = Annotated[
    int, typer.Option("--queue", min=1, help="Requests that may wait while one decodes; more get 429.")
]
SaveEvery = Annotated[
    float, typer.Option("--save-every", min=1.0, help="Save the matrix this often (seconds) while requests come.")
]
Metrics = Annotated[
    bool,
    typer.Option(
        "--metrics/--no-metrics",
        help="Serve Prometheus metrics at /metrics (behind --api-key when one is set).",
    ),
]

OpenSchemas = Annotated[
    bool,
    typer.Option(
        "--open-schemas",
        help="Read JSON schemas as written: objects take keys they do not list, numbers and strings "
        "are unbounded (by default they are closed and bounded; a request's open_schemas wins).",
    ),
]


def _bind(host: str, port: int) -> socket.socket:
    """A socket bound (not yet listening) to host:port; a one-line error when that fails."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise UserError(f"--host {host}: cannot resolve it ({exc.strerror})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise UserError(f"--port {port}: cannot listen on {host}:{port} ({exc.strerror})") from None
    return sock


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _stopped_by_signals(worker: DecodeWorker, server: uvicorn.Server) -> AbstractContextManager[None]:
    """SIGINT, SIGTERM and SIGHUP (the terminal closed) stop the worker and the HTTP server (a
    second one: without waiting for open connections) instead of killing the process, so that
    streamed replies end with an error event, the state is saved and the exit status is 0."""

    def stop(signum: int, frame) -> None:
        if server.should_exit:
            server.force_exit = True
        worker.stop_accepting()
        server.should_exit = True

    return handling((signal.SIGINT, *TERMINATING_SIGNALS), stop)


def _wait_started(server: uvicorn.Server, http: threading.Thread) -> None:
    while not server.started and not server.should_exit:
        if not http.is_alive():
            raise UserError("the HTTP server stopped while starting (see the messages above)")
        time.sleep(0.01)


def _general_name(source) -> str | None:
    """A GGUF's `general.name` (a name clients copy from model cards), when it has one."""
    if source.kind != "gguf" or source.path is None:
        return None
    from ..models.gguf_header import GGUFError, read_header

    try:
        name = read_header(source.path).values.get("general.name")
    except (GGUFError, OSError):
        return None
    return name if isinstance(name, str) else None


def _access_log() -> None:
    logger = logging.getLogger("tr.serve")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


@decoding_options()
def serve(
    host: Host = "127.0.0.1",
    port: Port = 8000,
    api_key: ApiKey = None,
    queue: QueueSize = 8,
    save_every: SaveEvery = 300.0,
    metrics: Metrics = True,
    open_schemas: OpenSchemas = False,
    *,
    options: DecodingOptions,
) -> None:
    """Serve a model over the OpenAI API (chat and text completions, streamed or not) with Token Recycling.

    GET / is a chat page for the browser (no key needed to load it; it asks for --api-key's), with the
    draft view: per step, what was drafted, what the model accepted and from which source."""
    if api_key is not None and not api_key.strip():
        raise UserError("--api-key is empty; give a key or leave the option out")
    sock = _bind(host, port)
    import uvicorn

    from ..core.decode import CONSTRAINED_DEPTH
    from ..serve.app import create_app
    from ..serve.connections import with_head_deadline
    from ..serve.metrics import ServerMetrics
    from ..serve.requests import ServedModel, model_aliases
    from ..serve.worker import DecodeWorker
    from ..text.schema_defaults import AS_WRITTEN, STRICT
    from .setup import open_engine, save_state

    try:
        engine = open_engine(options)
        loaded = engine.loaded
        served = ServedModel(
            name=loaded.model_id,
            aliases=model_aliases(options.model or DEFAULT_MODEL, loaded.source.path, _general_name(loaded.source)),
            tokenizer=loaded.tokenizer,
            generation_config=getattr(loaded.model, "generation_config", None),
            context_length=loaded.context_length,
            max_depth=max(engine.decoder.max_depth, CONSTRAINED_DEPTH),
            default_max_tokens=options.max_new_tokens,
            default_sampling=options.sampling,
            vocab_size=engine.decoder.vocab_size,
            stop_ids=tuple(loaded.eos_token_ids),
            schema_reading=AS_WRITTEN if open_schemas else STRICT,
        )
        counters = ServerMetrics() if metrics else None
        worker = DecodeWorker(
            engine.decoder,
            loaded.tokenizer,
            loaded.eos_token_ids,
            queue_size=queue,
            save=lambda end: save_state(engine, announce=end, end_conversation=end),
            save_every=save_every,
            metrics=counters,
        )
        _access_log()
        app = create_app(served, worker, api_key=api_key.strip() if api_key else None, metrics=counters)
        config = uvicorn.Config(
            app,
            http=with_head_deadline(),
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=10,
        )
        server = uvicorn.Server(config)
        http = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="tr-http", daemon=True)
        if not _is_loopback(host) and api_key is None:
            warn(f"listening on {host} without --api-key: anyone who can reach this machine can use it")
        sock.listen(128)
        bound_host, bound_port = sock.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        started = time.monotonic()
        try:
            with _stopped_by_signals(worker, server):
                http.start()
                _wait_started(server, http)
                note(f"tr serve: listening on http://{shown}:{bound_port}/v1 (model '{served.name}'; Ctrl-C stops)")
                note(f"tr serve: chat in the browser at http://{shown}:{bound_port}/")
                worker.run()
                server.should_exit = True  # the worker stopped on its own (an error): stop serving too
                http.join()
        finally:
            worker.close()
        served_count = counted(worker.jobs_done, "request")
        note(f"tr serve: stopped after {served_count} in {time.monotonic() - started:.0f} s")
    finally:
        sock.close()
