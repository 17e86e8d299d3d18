"""The HTTP side of `tr serve`: FastAPI routes for the OpenAI API, the API key and body-size
gate, OpenAI-shaped errors, and one access-log line per request.

Requests are parsed and checked here, on the event loop, before they queue (a bad request costs
no decode time); decoding happens on the worker thread, whose text comes back through the job.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import __version__
from .errors import ApiError
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import ServerMetrics
from .openapi import ERROR_RESPONSES, request_body, use_document
from .requests import ServedModel
from .responses import SSE_DONE, SSE_KEEPALIVE, Reply, sse
from .schema import ChatCompletionRequest, CompletionRequest
from .web_page import add_web_page
from .worker import DecodeWorker, Delta, Failed, Finished, Job, QueueFull

log = logging.getLogger("tr.serve")

MAX_BODY_BYTES = 8 * 1024 * 1024  # a long conversation is a few hundred kB of JSON
BODY_READ_SECONDS = 10.0  # the longest pause allowed while a request body arrives
_WAIT_SECONDS = 0.5  # how often a waiting request checks that its client is still there
CLIENT_LEFT = 499  # nginx's status for a client that closed the connection before the response
GUARDED = ("/v1", "/metrics")  # what the API key guards (/health stays open for load balancers)


class _ClientLeft(Exception):
    """The connection closed while the request body was still arriving."""


def _json_error(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


class RequestGate:
    """Before any route: the API key on /v1 (when one is set), the body size (413 over the
    limit) and its pace (408 when it pauses longer than `read_seconds`); the body is read once
    and replayed to the route. A body cut short by a disconnect reaches no route. Pure ASGI, so
    it also guards streamed bodies."""

    def __init__(self, app: ASGIApp, api_key: str | None, max_body: int, read_seconds: float) -> None:
        self.app = app
        self.api_key = api_key
        self.max_body = max_body
        self.read_seconds = read_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refuse_key(scope)
        if refusal is None:
            try:
                body, refusal = await self._read_body(scope, receive)
            except _ClientLeft:
                scope.setdefault("state", {})["left_after"] = "while sending the request body"
                return
        if refusal is not None:
            scope.setdefault("state", {})["error"] = refusal.message
            await _json_error(refusal)(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _refuse_key(self, scope: Scope) -> ApiError | None:
        if self.api_key is None or not scope["path"].startswith(GUARDED):
            return None
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            return None
        return ApiError(
            401,
            "Incorrect or missing API key: send 'Authorization: Bearer KEY' with the server's --api-key",
            code="invalid_api_key",
        )

    async def _read_body(self, scope: Scope, receive: Receive) -> tuple[bytes, ApiError | None]:
        too_big = ApiError(413, f"request body over {self.max_body:,} bytes", code="request_too_large")
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            return b"", too_big
        chunks, size = [], 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), self.read_seconds)
            except asyncio.TimeoutError:
                seconds = f"{self.read_seconds:g}"
                return b"", ApiError(408, f"the request body stopped arriving for {seconds} s", code="request_timeout")
            if message["type"] == "http.disconnect":
                raise _ClientLeft
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return b"", too_big
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks), None


class AccessLog:
    """One line per request once its response has ended: status, tokens, tok/s, MAT, time; and
    the request counted in the metrics, when there are any."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics | None = None) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # what the log says when the app raised before responding

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            status = _final_status(scope, status)
            log.info(_access_line(scope, status, time.perf_counter() - start))
            if self.metrics is not None:
                self.metrics.request(scope["path"], status)


def _final_status(scope: Scope, status: int) -> int:
    """The status sent, or CLIENT_LEFT when the client left before reading the end of it."""
    return CLIENT_LEFT if scope.get("state", {}).get("left_after") is not None else status


def _access_line(scope: Scope, status: int, seconds: float) -> str:
    client = scope.get("client")
    who = f"{client[0]}:{client[1]}" if client else "-"
    state = scope.get("state", {})
    left_after = state.get("left_after")
    parts = [f'{who} "{scope["method"]} {scope["path"]}" {status}']
    if left_after is not None:
        parts.append(f"the client left {left_after}")
    finished: Finished | None = state.get("finished")
    if finished is not None:
        stats = finished.stats
        reused = f" ({finished.reused} reused)" if finished.reused else ""
        parts += [
            f"{stats.prompt_tokens}+{stats.new_tokens} tokens{reused}",
            f"{stats.tokens_per_second:.1f} tok/s",
            f"MAT {stats.mean_accepted_tokens:.2f}",
        ]
    if state.get("error"):
        parts.append(state["error"])
    parts.append(f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:.0f} ms")
    return " · ".join(parts)


def _validation_message(exc: ValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    field = tuple(errors[0].get("loc", ()))[:1]
    # A union field (tool_choice: a word or an object) fails once per member: the deepest failure
    # is the member the value's shape chose ({"type": "function"} without a name: its `function`),
    # not the first member tried (the words); members' tags are no part of the param.
    first = max((e for e in errors if tuple(e.get("loc", ()))[:1] == field), key=lambda e: len(e.get("loc", ())))
    loc = [p for p in first.get("loc", ()) if not (isinstance(p, str) and _UNION_TAG.search(p))]
    param = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    # JSON as Python reads it takes NaN and Infinity: say so rather than pydantic's "should be finite"
    words = f"not a finite number, got {first['input']}" if first["type"] == "finite_number" else first["msg"]
    return (f"{param}: {words}" if param else words), param or None


_UNION_TAG = re.compile(r"^[A-Z]|[\[\]'(),]")  # pydantic's member names: a model's class, literal['auto',...]


def _parse(raw: bytes, model_class: type[ChatCompletionRequest] | type[CompletionRequest]):
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}") from None
    except RecursionError:  # the decoder recurses once per level: "[" * 100000 exhausts the stack
        raise ApiError(400, "the body is not valid JSON: nested too deeply") from None
    except ValueError as exc:  # an integer literal past Python's digit limit (sys.get_int_max_str_digits)
        raise ApiError(400, f"the body is not valid JSON: {str(exc).split(';')[0]}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object")
    try:
        return model_class.model_validate(data)
    except ValidationError as exc:
        message, param = _validation_message(exc)
        raise ApiError(400, message, param=param) from None


async def _wait(job: Job, request: Request) -> Finished | None:
    """A non-streamed job's outcome; None (job cancelled) when the client went away."""
    while True:
        item = await job.next(_WAIT_SECONDS)
        if item is None:
            if await request.is_disconnected():
                job.cancel()
                return None
            continue
        if isinstance(item, Failed):
            raise item.error
        if isinstance(item, Finished):
            return item


def create_app(
    model: ServedModel,
    worker: DecodeWorker,
    api_key: str | None = None,
    max_body: int = MAX_BODY_BYTES,
    body_read_seconds: float = BODY_READ_SECONDS,
    metrics: ServerMetrics | None = None,
) -> FastAPI:
    """The app; with `metrics`, GET /metrics serves them (behind the API key when one is set)."""
    app = FastAPI(title="tr serve", version=__version__, redoc_url=None)
    use_document(app, "The OpenAI API (chat and text completions, streamed or not), decoded with Token Recycling.")

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        request.state.error = exc.message
        return _json_error(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        return _json_error(ApiError(exc.status_code, f"{request.method} {request.url.path}: {detail}"))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return _json_error(ApiError(500, f"internal error: {exc}", type="server_error"))

    add_web_page(app)  # GET /: the chat page (outside /v1: it loads without the API key)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": model.name, "busy": worker.busy, "queued": worker.queued}

    def _model_card() -> dict:
        return {"id": model.name, "object": "model", "created": int(time.time()), "owned_by": "tr"}

    if metrics is not None:

        @app.get("/metrics", include_in_schema=False)
        async def scrape() -> Response:
            return Response(metrics.render(), media_type=METRICS_CONTENT_TYPE)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [_model_card()]}

    @app.get("/v1/models/{name:path}")
    async def one_model(name: str) -> dict:
        model.check_name(name)
        return _model_card()

    # Parsing, templating and tokenizing take seconds for megabytes of text: on a thread of their
    # own, so that one such request does not stall every other client (and /health). One thread:
    # a fast tokenizer is not safe to use from two threads at once.
    preparing = ThreadPoolExecutor(1, thread_name_prefix="tr-prepare")

    def _prepare(raw: bytes, chat: bool, loop: asyncio.AbstractEventLoop) -> tuple:
        parsed = _parse(raw, ChatCompletionRequest if chat else CompletionRequest)
        return parsed, model.job(parsed, loop)

    async def _generate(request: Request, chat: bool) -> Response:
        raw = await request.body()
        loop = asyncio.get_running_loop()
        parsed, job = await loop.run_in_executor(preparing, _prepare, raw, chat, loop)
        try:
            worker.submit(job)
        except QueueFull as full:
            raise ApiError(
                429,
                f"the server is busy ({worker.queued} requests waiting); retry in {full.retry_after} s",
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(full.retry_after)},
            ) from None
        reply = Reply(chat, model.name, read_calls=job.read_calls)
        if parsed.stream:
            return StreamingResponse(
                _stream(job, reply, request, parsed.include_usage()),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        finished = await _wait(job, request)
        if finished is None:
            request.state.left_after = "before the reply was ready"
            return Response(status_code=CLIENT_LEFT)  # nobody reads it
        request.state.finished = finished
        return JSONResponse(reply.whole(finished))

    async def _stream(job: Job, reply: Reply, request: Request, include_usage: bool):
        ended, generated = False, 0
        try:
            if reply.chat:
                yield sse(reply.chunk("", first=True))
            while True:
                item = await job.next(_WAIT_SECONDS)
                if item is None:  # queued or prefilling: a comment shows whether the client is there
                    yield SSE_KEEPALIVE
                elif isinstance(item, Delta):
                    generated = item.generated
                    if reply.read_calls is None:  # with tools the reply is read whole first
                        yield sse(reply.chunk(item.text, logprobs=item.logprobs, step=item.step))
                    elif item.step is not None:
                        yield sse(reply.chunk(step=item.step))  # an empty delta: the text comes whole
                elif isinstance(item, Failed):
                    request.state.error = item.error.message
                    ended = True
                    yield sse(item.error.body())
                    return
                else:  # Finished
                    request.state.finished = item
                    ended = True
                    if reply.read_calls is not None:
                        for chunk in reply.tool_chunks(item):
                            yield sse(chunk)
                    yield sse(reply.last_chunk(item))
                    if include_usage:
                        yield sse(reply.usage_chunk(item))
                    yield SSE_DONE
                    return
        finally:
            if not ended:  # the response was cut off: its client went away
                request.state.left_after = f"mid-stream, after {generated} tokens"
            job.cancel()  # a no-op once finished; stops the decode when the client went away

    @app.post("/v1/chat/completions", openapi_extra=request_body(ChatCompletionRequest), responses=ERROR_RESPONSES)
    async def chat_completions(request: Request) -> Response:
        return await _generate(request, chat=True)

    @app.post("/v1/completions", openapi_extra=request_body(CompletionRequest), responses=ERROR_RESPONSES)
    async def completions(request: Request) -> Response:
        return await _generate(request, chat=False)

    # The outermost layer logs what the gate refused too.
    app.add_middleware(RequestGate, api_key=api_key, max_body=max_body, read_seconds=body_read_seconds)
    app.add_middleware(AccessLog, metrics=metrics)
    return app
