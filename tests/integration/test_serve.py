"""`tr serve`'s app on a real uvicorn server on a free loopback port, driven by the official
`openai` client and raw HTTP: replies equal `model.generate`'s greedy reply for the rendered
prompt (streamed and not, chat and text completions, later turns from the KV cache, a rewound
branch), stop strings, seeded sampling, the queue bound (429), concurrent clients, disconnects,
every kind of bad request, the API key. The model is a random-weight Llama speaking through
SmolLM2's tokenizer and chat template."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from urllib.parse import quote

import httpx2 as httpx  # the HTTP client openai itself uses
import openai
import pytest
import torch
import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from tr_cli.core.sampling_config import SamplingConfig
from tr_cli.engine.engine import Engine
from tr_cli.engine.options import DecodingOptions
from tr_cli.serve.app import create_app
from tr_cli.serve.connections import HEAD_SECONDS, with_head_deadline
from tr_cli.serve.errors import ErrorResponse
from tr_cli.serve.metrics import ServerMetrics
from tr_cli.serve.requests import ServedModel
from tr_cli.serve.schema import ChatCompletionRequest, CompletionRequest
from tr_cli.serve.worker import DecodeWorker, Delta, Failed, Job

from tiny_models import random_prompt, reference, reference_with_logprobs

NAME = "tiny"


class Server:
    """uvicorn serving an app in a thread, on a port of its own."""

    def __init__(self, app, head_seconds: float = HEAD_SECONDS) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.address = self.sock.getsockname()
        self.url = f"http://127.0.0.1:{self.address[1]}"
        config = uvicorn.Config(app, http=with_head_deadline(head_seconds), log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="module")
def engine(tiny_llama_dir, tmp_path_factory):
    home = tmp_path_factory.mktemp("serve-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TR_HOME", str(home))
        options = DecodingOptions.parse(model=str(tiny_llama_dir), device="cpu", dtype="float32")
        yield Engine.open(options)


def served_model(engine, **extra) -> ServedModel:
    loaded = engine.loaded
    return ServedModel(
        name=NAME,
        aliases=frozenset({"tiny-alias"}),
        tokenizer=loaded.tokenizer,
        generation_config=loaded.model.generation_config,
        context_length=loaded.context_length,
        max_depth=engine.decoder.max_depth,
        vocab_size=engine.decoder.vocab_size,
        stop_ids=tuple(loaded.eos_token_ids),
        **extra,
    )


@contextmanager
def running(
    engine,
    start_worker: bool = True,
    queue_size: int = 8,
    api_key: str | None = None,
    max_body: int = 65536,
    metrics: ServerMetrics | None = None,
):
    """The app over the module's engine (its decoder keeps the last conversation between tests)."""
    loaded = engine.loaded
    worker = DecodeWorker(
        engine.decoder, loaded.tokenizer, loaded.eos_token_ids, queue_size=queue_size, metrics=metrics
    )
    app = create_app(served_model(engine), worker, api_key=api_key, max_body=max_body, metrics=metrics)
    if start_worker:
        worker.start()
    with Server(app) as server:
        server.worker = worker
        yield server
    worker.close(timeout=30)


@pytest.fixture(scope="module")
def server(engine):
    with running(engine) as server:
        yield server


def client(server: Server, **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, **kwargs)


def expected(engine, prompt_ids: list[int], max_new: int) -> tuple[str, list[int]]:
    """generate's greedy reply (cut at EOS) and its text, as the API returns it."""
    tokens = reference(engine.loaded.model, prompt_ids, max_new, eos=engine.loaded.eos_token_ids[0])
    return engine.loaded.tokenizer.decode(tokens, skip_special_tokens=True), tokens


def rendered(engine, messages: list[dict]) -> list[int]:
    tokenizer = engine.loaded.tokenizer
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def stream_text(stream) -> tuple[str, list]:
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three rivers."}]


def test_chat_reply_equals_generate_streamed_or_not(engine, server):
    ids = rendered(engine, MESSAGES)
    text, tokens = expected(engine, ids, 20)
    api = client(server)
    whole = api.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=20, temperature=0)
    assert whole.choices[0].message.content == text
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].finish_reason == ("stop" if len(tokens) < 20 else "length")
    assert whole.usage.prompt_tokens == len(ids)
    # What the client got: the end-of-turn token is not part of it.
    shown = len(tokens) - (tokens[-1] == engine.loaded.eos_token_ids[0])
    assert whole.usage.completion_tokens == shown
    assert whole.usage.total_tokens == len(ids) + shown
    assert whole.object == "chat.completion" and whole.model == NAME and whole.id.startswith("chatcmpl-")
    stats = whole.model_extra["tr"]
    assert stats["steps"] >= 1 and stats["mean_accepted_tokens"] >= 1.0

    streamed, chunks = stream_text(
        api.chat.completions.create(
            model=NAME,
            messages=MESSAGES,
            max_tokens=20,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert streamed == text
    assert chunks[0].choices[0].delta.role == "assistant"
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finishing] == [whole.choices[0].finish_reason]
    assert "tr" in finishing[0].model_extra
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == shown
    # The same prompt again: the cache held all of it, so only its last token was fed.
    assert finishing[0].model_extra["tr"]["prompt_tokens_reused"] == len(ids) - 1


def test_text_completion_equals_generate(engine, server):
    tokenizer = engine.loaded.tokenizer
    prompt = "The history of the river begins"
    ids = tokenizer.encode(prompt, add_special_tokens=True)
    text, _ = expected(engine, ids, 16)
    api = client(server)
    whole = api.completions.create(model=NAME, prompt=prompt, max_tokens=16)
    assert whole.choices[0].text == text and whole.object == "text_completion"
    streamed = "".join(
        c.choices[0].text for c in api.completions.create(model=NAME, prompt=prompt, max_tokens=16, stream=True)
    )
    assert streamed == text
    by_ids = api.completions.create(model="tiny-alias", prompt=ids, max_tokens=16)
    assert by_ids.choices[0].text == text


def test_later_turns_and_branches_reuse_the_cache_and_stay_exact(engine, server):
    api = client(server)
    first = [{"role": "user", "content": "Tell me about lakes."}]
    reply = api.chat.completions.create(model=NAME, messages=first, max_tokens=12).choices[0].message.content
    second = first + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And seas?"}]
    ids = rendered(engine, second)
    text, _ = expected(engine, ids, 12)
    answer = api.chat.completions.create(model=NAME, messages=second, max_tokens=12)
    assert answer.choices[0].message.content == text
    reused = answer.model_extra["tr"]["prompt_tokens_reused"]
    assert reused >= len(rendered(engine, first)) - 1
    assert answer.model_extra["tr"]["prefill_tokens"] == len(ids) - reused
    # An edited first message: only the shared start is reused, the reply is still generate's.
    edited = [{"role": "user", "content": "Tell me about mountains."}]
    ids = rendered(engine, edited)
    text, _ = expected(engine, ids, 12)
    answer = api.chat.completions.create(model=NAME, messages=edited, max_tokens=12)
    assert answer.choices[0].message.content == text
    assert 0 < answer.model_extra["tr"]["prompt_tokens_reused"] < len(ids)


def test_stop_strings_cut_the_reply_like_the_api(engine, server):
    ids = rendered(engine, MESSAGES)
    text, _ = expected(engine, ids, 24)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), "pick a visible stop string"
    cut = text[: text.find(stop)]
    api = client(server)
    whole = api.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=24, stop=[stop, "never seen"])
    assert whole.choices[0].message.content == cut
    assert whole.choices[0].finish_reason == "stop"
    # usage counts the tokens whose text the client got, none past the stop string.
    tokens, got = expected(engine, ids, 24)[1], whole.usage.completion_tokens
    decoded = [engine.loaded.tokenizer.decode(tokens[:k], skip_special_tokens=True) for k in (got - 1, got)]
    assert len(decoded[0]) < len(cut) <= len(decoded[1]) and got < len(tokens), (got, decoded, cut)
    streamed, _ = stream_text(
        api.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=24, stop=stop, stream=True)
    )
    assert streamed == cut


def test_seeded_sampling_is_reproducible(server):
    api = client(server)
    runs = [
        api.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=16, temperature=0.9, seed=7)
        .choices[0]
        .message.content
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    other = {
        api.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=16, temperature=0.9, seed=s)
        .choices[0]
        .message.content
        for s in range(8, 12)
    }
    assert len(other | {runs[0]}) > 1, "sampling ignored the seed"


def test_concurrent_clients_each_get_their_own_exact_answer(engine, server):
    questions = [f"Question number {i}: why is the sky blue?" for i in range(5)]
    wanted = [expected(engine, rendered(engine, [{"role": "user", "content": q}]), 10)[0] for q in questions]
    api = client(server, timeout=120)

    def ask(question: str) -> str:
        answer = api.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": question}], max_tokens=10
        )
        return answer.choices[0].message.content

    with ThreadPoolExecutor(len(questions)) as pool:
        answers = list(pool.map(ask, questions))
    assert answers == wanted


def test_a_full_queue_answers_429_with_retry_after(engine):
    body = {"model": NAME, "messages": MESSAGES, "max_tokens": 4}
    with running(engine, start_worker=False, queue_size=1) as server:
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(httpx.post, server.url + "/v1/chat/completions", json=body, timeout=60)
            deadline = time.monotonic() + 10
            while server.worker.queued < 1:
                assert time.monotonic() < deadline, "the first request never queued"
                time.sleep(0.02)
            refused = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=10)
            assert refused.status_code == 429
            assert refused.headers["Retry-After"] == "1"  # nothing runs yet: a slot may free at once
            assert refused.json()["error"]["code"] == "queue_full"
            server.worker.start()  # the queued request is served, not lost
            answer = waiting.result(timeout=60)
    assert answer.status_code == 200
    assert answer.json()["choices"][0]["message"]["content"] == expected(engine, rendered(engine, MESSAGES), 4)[0]


def test_shutdown_refuses_queued_requests_with_503(engine):
    body = {"model": NAME, "messages": MESSAGES, "max_tokens": 4}
    with running(engine, start_worker=False) as server:
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(httpx.post, server.url + "/v1/chat/completions", json=body, timeout=60)
            while server.worker.queued < 1:
                time.sleep(0.02)
            server.worker.stop_accepting()
            answer = waiting.result(timeout=30)
        assert answer.status_code == 503 and "shutting down" in answer.json()["error"]["message"]
        late = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=10)
        assert late.status_code == 503


def test_a_client_leaving_mid_stream_frees_the_slot_and_is_logged_as_leaving(engine, server, caplog):
    caplog.set_level(logging.INFO, logger="tr.serve")
    messages = [{"role": "user", "content": "Write a very long story about a lighthouse."}]
    body = {"model": NAME, "messages": messages, "max_tokens": 1500, "stream": True}
    prompt = len(rendered(engine, messages))
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        contents = 0
        for line in lines:
            if line.startswith("data: ") and '"content"' in line:
                contents += 1
                if contents == 3:
                    break  # and close the connection
    deadline = time.monotonic() + 20
    while server.worker.busy:
        assert time.monotonic() < deadline, "the decode went on after the client left"
        time.sleep(0.02)
    held = len(engine.decoder.tokens) - prompt
    assert 0 < held < 1500, "the reply was not cut"
    access = [r.getMessage() for r in caplog.records if "/v1/chat/completions" in r.getMessage()]
    assert len(access) == 1 and '" 499 · the client left mid-stream, after ' in access[0], access
    # The slot is free: the next request is served at once.
    answer = client(server).chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=4)
    assert answer.model_extra["tr"]["queue_seconds"] < 1.0


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert "type" in error and "param" in error and "code" in error
    return error


def test_bad_requests_get_openai_errors_and_change_nothing(engine, tiny_llama_dir):
    long_text = "river " * 4000  # far past the tiny model's 2,048 positions
    matrix_before = engine.decoder.matrix.clone()
    with running(engine, max_body=20000) as server:
        url = server.url + "/v1/chat/completions"

        def post(payload, **kwargs) -> httpx.Response:
            if isinstance(payload, dict | list):
                return httpx.post(url, json=payload, timeout=30, **kwargs)
            return httpx.post(url, content=payload, headers={"content-type": "application/json"}, timeout=30)

        good = {"model": NAME, "messages": MESSAGES, "max_tokens": 4}
        assert "JSON" in error_of(post(b'{"model": "tiny", "messages": ['), 400)["message"]
        assert error_of(post(b"[1, 2]"), 400)["message"]
        lone = b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800"}]}'  # not Unicode
        assert error_of(post(lone), 400)["param"] == "messages[0].content"
        assert error_of(post({"model": NAME}), 400)["param"] == "messages"
        assert error_of(post({**good, "messages": []}), 400)["param"] == "messages"
        assert error_of(post({**good, "temperature": "hot"}), 400)["param"] == "temperature"
        assert error_of(post({**good, "max_tokens": 0}), 400)["param"] == "max_tokens"
        assert error_of(post({**good, "messages": [{"role": "wizard", "content": "hi"}]}), 400)
        assert error_of(post({**good, "messages": [{"role": "user", "content": 5}]}), 400)
        assert error_of(post({**good, "n": 2}), 400)["param"] == "n"
        assert error_of(post({**good, "stop": ["a", "b", "c", "d", "e"]}), 400)["param"] == "stop"
        assert error_of(post({**good, "presence_penalty": 0.5}), 400)["param"] == "presence_penalty"
        assert error_of(post({**good, "tools": [{"type": "function"}]}), 400)
        image = [{"type": "image_url", "image_url": {"url": "data:,"}}]
        assert error_of(post({**good, "messages": [{"role": "user", "content": image}]}), 400)
        too_long = error_of(post({**good, "messages": [{"role": "user", "content": long_text[:19000]}]}), 400)
        assert too_long["code"] == "context_length_exceeded"
        assert "2048" in too_long["message"] and "tokens" in too_long["message"]
        assert error_of(post({**good, "model": "gpt-4o"}), 404)["code"] == "model_not_found"
        assert error_of(post({**good, "messages": [{"role": "user", "content": long_text}]}), 413)
        assert error_of(httpx.get(server.url + "/v1/nothing-here", timeout=10), 404)
        assert error_of(httpx.get(url, timeout=10), 405)
        completions = server.url + "/v1/completions"
        assert error_of(httpx.post(completions, json={"model": NAME, "prompt": ["a", "b"]}, timeout=10), 400)
        assert error_of(httpx.post(completions, json={"model": NAME, "prompt": [10**9]}, timeout=10), 400)
        assert error_of(httpx.post(completions, json={"model": NAME, "prompt": "x", "echo": True}, timeout=10), 400)
        assert server.worker.jobs_done == 0  # nothing bad reached the decoder
        assert torch.equal(engine.decoder.matrix, matrix_before)
        # Still serving.
        answer = post(good)
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] is not None


def test_max_tokens_past_the_context_is_clamped(engine, server):
    answer = client(server).chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=10**6)
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.usage.total_tokens <= engine.loaded.context_length


def test_api_key_is_required_when_set(engine):
    with running(engine, api_key="s3cret") as server:
        url = server.url + "/v1/models"
        assert error_of(httpx.get(url, timeout=10), 401)["code"] == "invalid_api_key"
        assert error_of(httpx.get(url, headers={"Authorization": "Bearer wrong"}, timeout=10), 401)
        # The key is checked before the body is read: a bad body without the key is still 401.
        bad = httpx.post(server.url + "/v1/chat/completions", content=b"{", timeout=10)
        assert bad.status_code == 401
        assert httpx.get(server.url + "/health", timeout=10).json()["status"] == "ok"
        api = openai.OpenAI(base_url=server.url + "/v1", api_key="s3cret", max_retries=0)
        assert [m.id for m in api.models.list().data] == [NAME]
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0).models.list()


def test_models_and_health(server):
    models = httpx.get(server.url + "/v1/models", timeout=10).json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == [NAME]
    assert httpx.get(server.url + f"/v1/models/{NAME}", timeout=10).json()["id"] == NAME
    assert httpx.get(server.url + "/v1/models/other", timeout=10).status_code == 404
    health = httpx.get(server.url + "/health", timeout=10).json()
    assert health["status"] == "ok" and health["model"] == NAME
    assert json.dumps(health)


def test_state_is_saved_periodically_and_at_close_and_a_failing_save_is_not_fatal(engine):
    calls: list[bool] = []

    def save(end_conversation: bool) -> None:
        calls.append(end_conversation)
        if len(calls) == 1:
            raise OSError("No space left on device")  # the first save fails

    metrics = ServerMetrics()
    loaded = engine.loaded
    worker = DecodeWorker(
        engine.decoder, loaded.tokenizer, loaded.eos_token_ids, save=save, save_every=0, metrics=metrics
    )
    with Server(create_app(served_model(engine), worker, metrics=metrics)) as server:
        worker.start()
        api = client(server)
        for saves in (1, 2):
            api.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=3)
            deadline = time.monotonic() + 10
            while len(calls) < saves:
                assert time.monotonic() < deadline, "no periodic save after a request"
                time.sleep(0.02)
        assert calls == [False, False]  # periodic saves keep the conversation going
        api.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=3)  # still serving
    worker.close(timeout=30)
    assert calls[-1] is True  # at close the conversation ends and joins the store
    saves = {s.labels["outcome"]: s.value for s in metrics.saves.collect()[0].samples if s.name.endswith("_total")}
    assert saves == {"failed": 1, "ok": len(calls) - 1}


class _LeavesDuringPrefill(Job):
    """A job whose client leaves (or whose server is told to stop) once the decoder has read the
    first prefill chunk: the moment a real client would be abandoning a long prompt."""

    decoder = None
    on_leave = None

    @property
    def cancelled(self) -> bool:
        if self.decoder.cached_length == 0:
            return False
        if self.on_leave is not None:
            self.on_leave()
            return False
        return True


def _serve_one(worker: DecodeWorker, job_class: type[Job], prompt: list[int], **attributes) -> list:
    """Run `worker` on its thread, submit one job of `job_class` and collect what it emits."""

    async def run() -> list:
        job = job_class(prompt=prompt, max_new_tokens=4, sampling=SamplingConfig.greedy())
        for name, value in attributes.items():
            setattr(job, name, value)
        worker.submit(job)
        items = []
        while not items or isinstance(items[-1], Delta):
            item = await job.next(30)
            assert item is not None, "the worker sent nothing within 30 s"
            items.append(item)
        return items

    worker.start()
    try:
        return asyncio.run(run())
    finally:
        worker.close(timeout=30)


def test_a_grammar_engine_that_gives_up_is_the_servers_500_not_the_clients_400(engine):
    """The grammar engine failing mid-decode is the server's failure (OpenAI's server_error), not
    a request to simplify the schema."""
    from set_constraint import SetConstraint

    from tr_cli.core.constraint import ConstraintError

    class GivesUp(SetConstraint):
        def advance(self, token: int) -> None:
            raise ConstraintError("tools: token refused (the engine gave up)")

    worker = DecodeWorker(engine.decoder, engine.loaded.tokenizer, engine.loaded.eos_token_ids)
    constraint = GivesUp(lambda path: range(engine.decoder.vocab_size), engine.decoder.vocab_size)
    (failed,) = _serve_one(worker, Job, rendered(engine, MESSAGES), constraint=constraint)
    assert isinstance(failed, Failed) and failed.error.status == 500, failed
    body = failed.error.body()["error"]
    assert body["type"] == "server_error" and "simplify" not in body["message"], body
    assert "the engine gave up" in body["message"]


@pytest.mark.parametrize("leaves", ["client", "server"])
def test_a_long_prompt_nobody_waits_for_stops_between_prefill_chunks(engine, leaves):
    """A client that leaves while its long prompt is read, or SIGTERM then: the worker stops
    before the next prefill chunk instead of reading the whole prompt, says why, and the decoder
    keeps the chunk it read."""
    engine.decoder.reset()
    worker = DecodeWorker(engine.decoder, engine.loaded.tokenizer, engine.loaded.eos_token_ids)
    prompt = random_prompt(1000, 5)  # two prefill chunks of 500
    on_leave = worker.stop_accepting if leaves == "server" else None
    items = _serve_one(worker, _LeavesDuringPrefill, prompt, decoder=engine.decoder, on_leave=on_leave)
    assert len(items) == 1 and isinstance(items[0], Failed)
    why = "the server is shutting down" if leaves == "server" else "the client went away"
    assert items[0].error.status == 503 and items[0].error.message == f"generation stopped: {why}"
    assert engine.decoder.cached_length == 500
    assert engine.decoder.tokens == prompt[:501]


class _SlowTokenizer:
    """The model's tokenizer, but `encode` waits until the test lets it go: a stand-in for the
    seconds megabytes of text take, long enough to see whether other clients are served."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self.entered = threading.Event()
        self.release = threading.Event()

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def __len__(self) -> int:
        return len(self._tokenizer)

    def encode(self, *args, **kwargs):
        self.entered.set()
        assert self.release.wait(30), "the test never released the tokenizer"
        return self._tokenizer.encode(*args, **kwargs)


def test_a_request_being_tokenized_does_not_stall_other_clients(engine):
    slow = _SlowTokenizer(engine.loaded.tokenizer)
    model = served_model(engine)
    model.encoder.tokenizer = slow
    worker = DecodeWorker(engine.decoder, engine.loaded.tokenizer, engine.loaded.eos_token_ids)
    body = {"model": NAME, "messages": MESSAGES, "max_tokens": 2}
    with Server(create_app(model, worker)) as server, ThreadPoolExecutor(1) as pool:
        worker.start()
        posted = pool.submit(httpx.post, server.url + "/v1/chat/completions", json=body, timeout=60)
        assert slow.entered.wait(30), "the request never reached the tokenizer"
        health = httpx.get(server.url + "/health", timeout=10)  # times out if tokenizing holds the loop
        assert health.status_code == 200
        slow.release.set()
        assert posted.result(timeout=60).status_code == 200
    worker.close(timeout=30)


def test_a_prompt_that_cannot_fit_is_refused_before_it_is_tokenized(engine):
    """Megabytes of text are refused by a character bound, not after seconds of tokenizing."""
    context = engine.loaded.context_length
    words = "word " * (context * 90 // 5)  # more characters than `context` tokens can hold
    chat = {"model": NAME, "messages": [{"role": "user", "content": words}]}
    text = {"model": NAME, "prompt": words}
    with running(engine, max_body=8 * 1024 * 1024) as server:
        answers = [
            (httpx.post(f"{server.url}/v1/{path}", json=body, timeout=60), param)
            for path, body, param in (("chat/completions", chat, "messages"), ("completions", text, "prompt"))
        ]
    for answer, param in answers:
        error = error_of(answer, 400)
        assert error["code"] == "context_length_exceeded" and error["param"] == param
        assert f"{len(words):,} characters" in error["message"]
        assert f"maximum context length is {context} tokens" in error["message"]


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes `sock` (reads end) within `seconds`; what it sends first is read."""
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    return True


HALF_A_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"


@pytest.mark.parametrize("sent", [b"", HALF_A_HEAD], ids=["nothing", "half a head"])
def test_a_connection_without_a_whole_request_head_is_closed(engine, sent):
    worker = DecodeWorker(engine.decoder, engine.loaded.tokenizer, engine.loaded.eos_token_ids)
    with Server(create_app(served_model(engine), worker), head_seconds=0.5) as server:
        with socket.create_connection(server.address) as idle:
            idle.sendall(sent)
            assert _closed_within(idle, 20), "the connection was never closed"
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200  # others are served


def _send_partial_body(server: Server, then_close: bool) -> bytes:
    head = HALF_A_HEAD + b"Content-Type: application/json\r\nContent-Length: 400\r\n\r\n"
    with socket.create_connection(server.address) as sock:
        sock.sendall(head + b'{"model": "tiny", "mess')
        if then_close:
            sock.shutdown(socket.SHUT_WR)
        sock.settimeout(20)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
        return answer


def test_a_body_that_stops_arriving_gets_408_and_one_cut_short_is_logged_as_the_client_leaving(engine, caplog):
    caplog.set_level(logging.INFO, logger="tr.serve")
    worker = DecodeWorker(engine.decoder, engine.loaded.tokenizer, engine.loaded.eos_token_ids)
    with Server(create_app(served_model(engine), worker, body_read_seconds=0.5)) as server:
        stalled = _send_partial_body(server, then_close=False)
        assert stalled.startswith(b"HTTP/1.1 408 ") and b'"code":"request_timeout"' in stalled
        _send_partial_body(server, then_close=True)
        deadline = time.monotonic() + 10
        while len([r for r in caplog.records if "/v1/chat" in r.getMessage()]) < 2:
            assert time.monotonic() < deadline, "no access line for the cut body"
            time.sleep(0.02)
    access = [r.getMessage() for r in caplog.records if "/v1/chat" in r.getMessage()]
    assert '" 408 · ' in access[0]
    assert '" 499 · the client left while sending the request body' in access[1], access
    assert not any("JSON" in line for line in access)  # a cut body is never parsed


# -- the OpenAPI document, and every route fuzzed from it ---------------------------------------


def _json_values() -> st.SearchStrategy:
    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)

    def nested(inner: st.SearchStrategy) -> st.SearchStrategy:
        return st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)

    return st.recursive(scalars, nested, max_leaves=12)


def _from_schema(schema: dict, components: dict) -> st.SearchStrategy:
    """Values valid for a JSON schema as pydantic writes them (refs, anyOf, enums, bounds,
    objects with required and optional properties): enough to fuzz our own request bodies."""
    if "$ref" in schema:
        return st.deferred(lambda: _from_schema(components[schema["$ref"].rsplit("/", 1)[-1]], components))
    if "anyOf" in schema:
        return st.one_of([_from_schema(option, components) for option in schema["anyOf"]])
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties", {})
        required = {name: _from_schema(properties[name], components) for name in schema.get("required", [])}
        optional = {name: _from_schema(p, components) for name, p in properties.items() if name not in required}
        return st.fixed_dictionaries(required, optional=optional)
    if kind == "array":
        items = _from_schema(schema.get("items", {}), components)
        return st.lists(items, min_size=schema.get("minItems", 0), max_size=max(3, schema.get("minItems", 0)))
    if kind == "string":
        return st.text(min_size=schema.get("minLength", 0), max_size=40)
    if kind == "integer":
        high = schema.get("maximum", schema.get("exclusiveMaximum", 2**70) - 1)
        return st.integers(schema.get("minimum", schema.get("exclusiveMinimum", -(2**70)) + 1), high)
    if kind == "number":
        return st.floats(
            schema.get("minimum", schema.get("exclusiveMinimum")),
            schema.get("maximum", schema.get("exclusiveMaximum")),
            allow_nan=False,
            allow_infinity=False,
            exclude_min="exclusiveMinimum" in schema,
            exclude_max="exclusiveMaximum" in schema,
        )
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return _json_values()  # any JSON: no type given


def _mutated(body: dict, data: st.DataObject) -> dict:
    """`body` with one field (one of its own, or a made-up one) set to any JSON value."""
    names = sorted(body) + ["model", "messages", "prompt", "max_tokens", "stream", "seed", "stop"]
    name = data.draw(st.sampled_from(names))
    return {**body, name: data.draw(_json_values())}


def _small(body):
    """A fuzzed body with its reply kept to a few tokens (the fuzz is about the API, not decoding)."""
    if isinstance(body, dict):
        for name in ("max_tokens", "max_completion_tokens"):
            if isinstance(body.get(name), int) and not isinstance(body[name], bool) and body[name] > 4:
                body[name] = 4
    return body


def _assert_openai_shaped(response) -> None:
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert response.headers["content-type"].startswith("application/json"), response.headers
        ErrorResponse.model_validate(response.json())
    elif response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data: {") and '"error"' in line[:12]:
                ErrorResponse.model_validate_json(line[len("data: ") :])


def test_the_openapi_document_describes_the_real_bodies_and_the_error_shape(server):
    document = httpx.get(server.url + "/openapi.json", timeout=10).json()
    schemas = document["components"]["schemas"]
    for path, model in (("/v1/chat/completions", ChatCompletionRequest), ("/v1/completions", CompletionRequest)):
        operation = document["paths"][path]["post"]
        body = operation["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{model.__name__}"}
        assert set(schemas[model.__name__]["properties"]) == set(model.model_fields)
        for status in ("400", "401", "404", "413", "429", "503"):
            error = operation["responses"][status]["content"]["application/json"]["schema"]
            assert error == {"$ref": "#/components/schemas/ErrorResponse"}
    assert httpx.get(server.url + "/docs", timeout=10).status_code == 200


def _fuzz_posts(http: TestClient, path: str, valid: st.SearchStrategy) -> list[int]:
    """The statuses of fuzzed posts to `path`."""
    statuses = []

    @settings(max_examples=100, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def post(data: st.DataObject) -> None:
        kind = data.draw(st.sampled_from(["valid", "mutated", "json", "bytes"]))
        if kind == "bytes":
            content = data.draw(st.binary(max_size=64))
        else:
            body = data.draw(valid)
            if kind == "valid":  # a few fields, the served model: most such bodies reach the decoder
                kept = data.draw(st.sets(st.sampled_from(sorted(body)), max_size=3))
                body = {name: value for name, value in body.items() if name in kept or name in REQUIRED}
                body["model"] = NAME
            if kind == "mutated":
                body = _mutated(body, data)
            elif kind == "json":
                body = data.draw(_json_values())
            content = json.dumps(_small(body)).encode()
        response = http.post(path, content=content, headers={"content-type": "application/json"})
        _assert_openai_shaped(response)
        statuses.append(response.status_code)

    post()
    return statuses


def _fuzz_gets(http: TestClient) -> None:
    @settings(max_examples=40, deadline=None, derandomize=True, database=None)
    @given(name=st.text(max_size=30), method=st.sampled_from(["GET", "POST", "DELETE"]))
    def request(name: str, method: str) -> None:
        for path in ("/health", "/v1/models", "/v1/models/" + quote(name, safe="")):
            _assert_openai_shaped(http.request(method, path))

    request()


def test_fuzzing_every_route_gets_no_5xx_and_only_openai_shaped_errors(engine):
    """A bounded property-based fuzz of every route the document lists: bodies generated from its
    schemas, the same with one field made anything, any JSON, any bytes, any model name."""
    worker = DecodeWorker(engine.decoder, engine.loaded.tokenizer, engine.loaded.eos_token_ids)
    app = create_app(served_model(engine, default_max_tokens=4), worker)
    worker.start()
    try:
        with TestClient(app, raise_server_exceptions=False) as http:
            document = http.get("/openapi.json").json()
            assert set(document["paths"]) == FUZZED_PATHS, "a route was added: fuzz it here too"
            for path in ("/v1/chat/completions", "/v1/completions"):
                body = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
                statuses = _fuzz_posts(http, path, _from_schema(body, document["components"]["schemas"]))
                assert 200 in statuses and 400 in statuses, f"{path}: the fuzz missed the decoder or the checks"
            _fuzz_gets(http)
    finally:
        worker.close(timeout=30)


REQUIRED = {"model", "messages", "prompt"}
FUZZED_PATHS = {"/health", "/v1/models", "/v1/models/{name}", "/v1/chat/completions", "/v1/completions"}


def scrape(server: Server, **headers) -> dict:
    """GET /metrics, parsed as Prometheus parses it: {sample name: {labels: value}}."""
    response = httpx.get(server.url + "/metrics", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples: dict = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def test_metrics_count_what_was_served(engine):
    with running(engine, metrics=ServerMetrics(), api_key="sesame") as server:
        api = openai.OpenAI(base_url=server.url + "/v1", api_key="sesame", max_retries=0)
        engine.decoder.reset()
        reply = api.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=24, temperature=0)
        with pytest.raises(openai.BadRequestError):
            api.chat.completions.create(model=NAME, messages=MESSAGES, n=2)
        assert httpx.get(server.url + "/metrics", timeout=10).status_code == 401  # behind the key
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200  # not behind it
        m = scrape(server, Authorization="Bearer sesame")

    def one(name: str, **labels) -> float:
        return m[name][tuple(sorted(labels.items()))]

    chat = "/v1/chat/completions"
    assert one("tr_requests_total", route=chat, status="200") == 1
    assert one("tr_requests_total", route=chat, status="400") == 1
    assert one("tr_requests_total", route="/metrics", status="401") == 1
    assert one("tr_requests_total", route="/health", status="200") == 1
    usage, stats = reply.usage, reply.model_extra["tr"]
    assert one("tr_prompt_tokens_total") == usage.prompt_tokens
    generated = one("tr_generated_tokens_total")  # every token decoded, the end of turn too
    assert generated == usage.completion_tokens + (reply.choices[0].finish_reason == "stop")
    steps, step_tokens = one("tr_decode_steps_total"), one("tr_step_tokens_total")
    assert steps == stats["steps"] > 0
    assert step_tokens == generated - 1  # the prefill emits the first token
    assert step_tokens / steps == pytest.approx(stats["mean_accepted_tokens"], abs=1e-4)
    # Each step emits its accepted drafts and at most one bonus token; a node counts for every
    # source that drafted it.
    accepted = m.get("tr_accepted_draft_tokens_total", {})
    assert sum(accepted.values()) >= step_tokens - steps
    assert {dict(labels)["source"] for labels in accepted} <= {"matrix", "lookup", "store"}
    assert one("tr_time_to_first_token_seconds_count") == 1
    assert one("tr_time_per_output_token_seconds_count") == 1
    assert one("tr_queue_depth") == 0 and one("tr_decoding") == 0
    assert one("tr_matrix_rows_filled") > 0
    assert one("tr_decodes_total", outcome="finished") == 1


def test_metrics_are_off_unless_asked_for(server):
    assert httpx.get(server.url + "/metrics", timeout=10).status_code == 404


def compatibility_rows() -> list[tuple[str, str, str, object]]:
    """docs/server.md's compatibility table: (field, endpoints, status, example value)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "server.md").read_text()
    table = text.split("#### Compatibility", 1)[1]
    rows = []
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`"):
            field, endpoints, status, example = cells[0].strip("`"), cells[1], cells[2], cells[3].strip("`")
            rows.append((field, endpoints, status, json.loads(example)))
    return rows


ROWS = compatibility_rows()


def test_the_compatibility_table_covers_the_request_fields():
    for endpoint, request_class in (("chat", ChatCompletionRequest), ("text", CompletionRequest)):
        rows = {field for field, endpoints, *_ in ROWS if endpoint in endpoints.split(", ")}
        missing = set(request_class.model_fields) - rows
        assert not missing, f"no row in docs/server.md's table for {endpoint}: {sorted(missing)}"
    assert {status for _, _, status, _ in ROWS} == {"supported", "refused", "ignored"}


@pytest.mark.parametrize(
    "field, endpoint, status, example",
    [
        (field, endpoint, status, example)
        for field, endpoints, status, example in ROWS
        for endpoint in endpoints.split(", ")
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_each_field_does_what_the_compatibility_table_says(server, field, endpoint, status, example):
    body = {"model": NAME, "max_tokens": 2}
    if endpoint == "chat":
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": "Hi"}]
    else:
        path, body["prompt"] = "/v1/completions", "Once upon a time"
    if isinstance(example, dict) and field in example:
        body.update(example)  # a field that needs another beside it
    else:
        body[field] = example
    response = httpx.post(server.url + path, json=body, timeout=60)
    if status == "refused":
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        # tr's refusal ("... not supported", "only ... is supported"), not a validation error
        assert (error["param"] == field or field in error["message"]) and "supported" in error["message"], error
    else:
        assert response.status_code == 200, response.text
        if not body.get("stream"):
            assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")


def reference_logprobs(engine, prompt_ids: list[int], max_new: int) -> tuple[list[int], torch.Tensor]:
    """generate's greedy tokens (EOS included) and the log-softmax of its logits at each."""
    return reference_with_logprobs(engine.loaded.model, prompt_ids, max_new, eos=engine.loaded.eos_token_ids[0])


def test_logprobs_are_the_models_own_streamed_or_not(engine, server):
    api = client(server)
    tokens, logs = reference_logprobs(engine, rendered(engine, MESSAGES), 16)
    eos = engine.loaded.eos_token_ids[0]
    shown = [t for t in tokens if t != eos]
    engine.decoder.reset()
    whole = api.chat.completions.create(
        model=NAME, messages=MESSAGES, max_tokens=16, temperature=0, logprobs=True, top_logprobs=3
    )
    content = whole.choices[0].logprobs.content
    assert len(content) == len(shown) > 0
    tokenizer = engine.loaded.tokenizer
    for i, (entry, token) in enumerate(zip(content, shown, strict=True)):
        assert entry.token == tokenizer.decode([token])
        assert entry.logprob == pytest.approx(logs[i, token].item(), abs=1e-4)
        best = torch.topk(logs[i], 3)
        assert [alt.logprob for alt in entry.top_logprobs] == pytest.approx(best.values.tolist(), abs=1e-4)
    # The tokens' exact bytes spell the reply, characters split over tokens included.
    assert bytes(b for entry in content for b in entry.bytes).decode() == whole.choices[0].message.content
    streamed = api.chat.completions.create(
        model=NAME, messages=MESSAGES, max_tokens=16, temperature=0, logprobs=True, top_logprobs=3, stream=True
    )
    pieces = [
        entry
        for chunk in streamed
        if chunk.choices and chunk.choices[0].logprobs
        for entry in chunk.choices[0].logprobs.content
    ]
    assert [(e.token, round(e.logprob, 4)) for e in pieces] == [(e.token, round(e.logprob, 4)) for e in content]
    without = api.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=4, temperature=0)
    assert without.choices[0].logprobs is None


def test_text_completion_logprobs_and_a_stop_string(engine, server):
    api = client(server)
    ids = random_prompt(10, seed=11)
    tokenizer = engine.loaded.tokenizer
    prompt = tokenizer.decode(ids)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=True)
    tokens, logs = reference_logprobs(engine, prompt_ids, 12)
    eos = engine.loaded.eos_token_ids[0]
    shown = [t for t in tokens if t != eos]
    reply = api.completions.create(model=NAME, prompt=prompt, max_tokens=12, temperature=0, logprobs=2)
    lp = reply.choices[0].logprobs
    assert lp.tokens == [tokenizer.decode([t]) for t in shown]
    assert lp.token_logprobs == pytest.approx([logs[i, t].item() for i, t in enumerate(shown)], abs=1e-4)
    text = reply.choices[0].text
    # The legacy API's top_logprobs: the 2 most likely and the chosen token (often one of them).
    assert all(token in top and 1 <= len(top) <= 3 for token, top in zip(lp.tokens, lp.top_logprobs, strict=True))
    # Each offset is where the token's text starts in the reply (a token holding part of a
    # character reads as U+FFFD alone: its place is still in order).
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert all(offset < len(text) for offset in lp.text_offset)
    whole = [(o, t) for o, t in zip(lp.text_offset, lp.tokens, strict=True) if "\ufffd" not in t]
    assert whole and all(text[o : o + len(t)] == t for o, t in whole)
    # A stop string cuts the reply: only the tokens whose text shows keep their entries.
    at = next(i for i in range(1, len(lp.tokens)) if lp.tokens[i].strip() and text.find(lp.tokens[i].strip()) > 0)
    stop = lp.tokens[at].strip()
    cut = api.completions.create(model=NAME, prompt=prompt, max_tokens=12, temperature=0, logprobs=0, stop=[stop])
    kept = cut.choices[0].logprobs.tokens
    assert cut.choices[0].text == text[: text.find(stop)]
    assert 0 < len(kept) <= at + 1 and "".join(kept).startswith(cut.choices[0].text)
    assert len(kept) < len(lp.tokens)


# --- structured output ---------------------------------------------------------------------

CITY = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "country": {"enum": ["France", "Italy", "Japan"]},
        "population": {"type": "integer", "minimum": 0, "maximum": 999},
        "capital": {"type": "boolean"},
    },
    "required": ["name", "country", "population", "capital"],
    "additionalProperties": False,
}


def constrained_reference(engine, prompt_ids: list[int], grammar, max_new: int) -> list[int]:
    """generate's greedy reply under a grammar (or a JSON schema's), with tr's own logits processor."""
    from tr_cli.text.grammar import Grammar, GrammarCompiler
    from tr_cli.text.grammar_logits import GrammarLogitsProcessor

    loaded = engine.loaded
    grammars = GrammarCompiler(loaded.tokenizer, engine.decoder.vocab_size, loaded.eos_token_ids)
    grammar = grammar if isinstance(grammar, Grammar) else Grammar.json_schema(grammar)
    processor = GrammarLogitsProcessor(grammars.constraint(grammar), len(prompt_ids))
    eos = loaded.eos_token_ids[0]
    return reference_with_logprobs(loaded.model, prompt_ids, max_new, eos, logprobs=False, processors=[processor])[0]


def test_a_json_schema_reply_is_constrained_generates_streamed_or_not(engine, server):
    api = client(server)
    messages = [{"role": "user", "content": "A city, as JSON."}]
    tokens = constrained_reference(engine, rendered(engine, messages), CITY, 60)
    want = engine.loaded.tokenizer.decode(tokens, skip_special_tokens=True)
    response_format = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}
    whole = api.chat.completions.create(
        model=NAME, messages=messages, max_tokens=60, temperature=0, response_format=response_format
    )
    assert whole.choices[0].message.content == want
    assert whole.choices[0].finish_reason == "stop"  # the object closed, then only EOS was allowed
    # usage counts what the client got: the reply's tokens, not the end of turn the grammar forced.
    assert tokens[-1] == engine.loaded.eos_token_ids[0]
    assert whole.usage.completion_tokens == len(tokens) - 1
    city = json.loads(want)
    assert set(city) == set(CITY["properties"]) and city["country"] in ("France", "Italy", "Japan")
    engine.decoder.reset()
    streamed, chunks = stream_text(
        api.chat.completions.create(
            model=NAME,
            messages=messages,
            max_tokens=60,
            temperature=0,
            response_format=response_format,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert streamed == want and chunks[-1].usage.completion_tokens == len(tokens) - 1
    # The text completions endpoint takes the same field.
    text = api.completions.create(
        model=NAME, prompt="City:", max_tokens=60, temperature=0, extra_body={"response_format": response_format}
    )
    assert set(json.loads(text.choices[0].text)) == set(CITY["properties"])


def test_the_openai_clients_parse_helper_gets_its_model_back(server):
    from typing import Literal

    from pydantic import BaseModel, Field

    class Shape(BaseModel):
        kind: Literal["circle", "square"]
        size: int = Field(ge=1, le=99)
        filled: bool

    parsed = client(server).chat.completions.parse(
        model=NAME,
        messages=[{"role": "user", "content": "A shape."}],
        max_tokens=40,
        temperature=0,
        response_format=Shape,
    )
    shape = parsed.choices[0].message.parsed
    assert isinstance(shape, Shape) and 1 <= shape.size <= 99


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "strin"}, "Invalid type: strin"),
        ({"type": "array", "uniqueItems": True, "items": {"type": "integer"}}, "uniqueItems"),
        ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "recurses"),
        (
            {"type": "object", "properties": {f"f{i}": {"description": "x" * 300} for i in range(4000)}},
            "at most 100,000",
        ),
    ],
    ids=["invalid", "unsupported-keyword", "recursive-ref", "1MB"],
)
def test_bad_schemas_get_a_400_naming_the_problem_and_never_reach_the_decoder(engine, schema, words):
    with running(engine, max_body=4 * 1024 * 1024) as server:
        with pytest.raises(openai.BadRequestError) as caught:
            client(server).chat.completions.create(
                model=NAME,
                messages=[{"role": "user", "content": "x"}],
                response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}},
            )
        error = caught.value.body
        assert error["param"] == "response_format" and words in error["message"], error
        assert server.worker.jobs_done == 0


# --- tools ---------------------------------------------------------------------------------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather now in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
TIME_TOOL = {"type": "function", "function": {"name": "get_time", "description": "The time now.", "strict": True}}


def check_weather_call(call) -> dict:
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"city", "unit"} and arguments["unit"] in ("celsius", "fahrenheit")
    assert isinstance(arguments["city"], str) and len(arguments["city"]) <= 12
    return arguments


def streamed_calls(stream) -> tuple[str, list[dict], str]:
    """Content, calls (id, name, arguments joined from their pieces) and finish reason of a stream."""
    content, calls, reason = "", {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for piece in choice.delta.tool_calls or ():
            call = calls.setdefault(piece.index, {"id": None, "name": None, "arguments": ""})
            call["id"] = piece.id or call["id"]
            if piece.function is not None:
                call["name"] = piece.function.name or call["name"]
                call["arguments"] += piece.function.arguments or ""
        reason = choice.finish_reason or reason
    return content, [calls[i] for i in sorted(calls)], reason


def test_a_tool_round_trip_through_the_openai_client_on_a_template_without_tools(engine, server):
    """SmolLM2's template knows no tools: they are described in the system message and the reply
    is held to {"tool_call": ...} or {"response": ...} (the generic format)."""
    from tr_cli.text.tools import NO_PARAMETERS, GenericFormat, Tool, ToolChoice

    api = client(server)
    messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
    first = api.chat.completions.create(
        model=NAME, messages=messages, tools=[WEATHER_TOOL, TIME_TOOL], tool_choice="required", max_tokens=60
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, repr(choice.message.content)
    (call,) = choice.message.tool_calls
    if call.function.name == "get_weather":
        arguments = check_weather_call(call)
    else:
        arguments = json.loads(call.function.arguments)
        assert call.function.name == "get_time" and arguments == {}
    # Exact: the call is what constrained generate writes for the prompt the generic format renders.
    tools = [Tool("get_weather", "The weather now in a city.", WEATHER_TOOL["function"]["parameters"], True)]
    tools.append(Tool("get_time", "The time now.", dict(NO_PARAMETERS), True))
    prepared = GenericFormat().prepare(messages, tools, ToolChoice("required"))
    grammar = GenericFormat().grammar(tools, ToolChoice("required"))
    tokens = constrained_reference(engine, rendered(engine, prepared), grammar, 60)
    written = json.loads(engine.loaded.tokenizer.decode(tokens, skip_special_tokens=True))
    assert written == {"tool_call": {"name": call.function.name, "arguments": arguments}}
    # The same call streamed as OpenAI streams calls: index, id and name first, then the arguments.
    engine.decoder.reset()
    content, calls, reason = streamed_calls(
        api.chat.completions.create(
            model=NAME,
            messages=messages,
            tools=[WEATHER_TOOL, TIME_TOOL],
            tool_choice="required",
            max_tokens=60,
            stream=True,
        )
    )
    assert content == "" and reason == "tool_calls" and len(calls) == 1
    assert calls[0]["name"] == call.function.name and json.loads(calls[0]["arguments"]) == arguments
    # The result goes back; the model answers (or calls again), either way in the right shape.
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "5 C"},
    ]
    final = api.chat.completions.create(model=NAME, messages=messages, tools=[WEATHER_TOOL, TIME_TOOL], max_tokens=80)
    answer = final.choices[0]
    if answer.finish_reason == "tool_calls":
        assert answer.message.tool_calls and answer.message.content is None
    else:
        assert answer.finish_reason in ("stop", "length") and isinstance(answer.message.content, str)
    named = api.chat.completions.create(
        model=NAME,
        messages=messages[:1],
        tools=[WEATHER_TOOL, TIME_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=60,
    )
    check_weather_call(named.choices[0].message.tool_calls[0])


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"tool_choice": "required"}, "tool_choice", "tools is empty"),
        (
            {"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "nope",
        ),
        ({"tools": [WEATHER_TOOL], "logprobs": True}, "logprobs", "tools"),
        ({"tools": [WEATHER_TOOL, WEATHER_TOOL]}, "tools", "names two tools"),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}, "strict": True}}
                ]
            },
            "tools",
            "tools[0].function.parameters",
        ),
        ({"functions": [{"name": "f"}]}, "functions", "use tools"),
    ],
)
def test_bad_tool_requests_get_a_400(server, fields, param, words):
    body = {"model": NAME, "messages": [{"role": "user", "content": "Hi"}], **fields}
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error


@pytest.fixture(scope="module")
def hermes_engine(tiny_hermes_dir, tmp_path_factory):
    """The tiny model with a Qwen-style (Hermes) tool template whose tags are single tokens."""
    home = tmp_path_factory.mktemp("hermes-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TR_HOME", str(home))
        yield Engine.open(DecodingOptions.parse(model=str(tiny_hermes_dir), device="cpu", dtype="float32"))


def test_a_tool_round_trip_on_a_qwen_style_template(hermes_engine):
    """The template's `<tool_call>` is one token (as Qwen2.5's): forced calls (required, named,
    streamed, strict or not) are written with that token, and read back as calls."""
    from tr_cli.text.tools import HermesFormat, Tool, ToolChoice, tool_format

    tokenizer = hermes_engine.loaded.tokenizer
    tags = [tokenizer.convert_tokens_to_ids(tag) for tag in ("<tool_call>", "</tool_call>")]
    assert tokenizer.encode("<tool_call></tool_call>", add_special_tokens=False) == tags
    with running(hermes_engine) as server:
        api = client(server)
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Rome?"}]
        first = api.chat.completions.create(
            model=NAME, messages=messages, tools=[WEATHER_TOOL], tool_choice="required", max_tokens=80
        )
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        arguments = check_weather_call(choice.message.tool_calls[0])
        # The template renders the tools itself, and the call is constrained generate's.
        tools = [Tool("get_weather", "The weather now in a city.", WEATHER_TOOL["function"]["parameters"], True)]
        prompt = tokenizer.apply_chat_template(
            messages, tools=[WEATHER_TOOL], tokenize=False, add_generation_prompt=True
        )
        assert "<tools>" in prompt and '"get_weather"' in prompt
        served = tool_format(tokenizer.chat_template, tokenizer.get_added_vocab())
        assert isinstance(served, HermesFormat) and served.tag_tokens == tuple(tags)
        grammar = served.grammar(tools, ToolChoice("required"))
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        written_ids = constrained_reference(hermes_engine, ids, grammar, 80)
        assert written_ids[0] == tags[0] and tags[1] in written_ids
        written = tokenizer.decode(written_ids, skip_special_tokens=True)
        assert json.loads(served.parse(written, tools)[1][0].arguments) == arguments
        # Named, streamed, and a tool that is not strict: the same single-token tags.
        lenient = {**WEATHER_TOOL, "function": {**WEATHER_TOOL["function"], "strict": False}}
        for tool in (WEATHER_TOOL, lenient):
            named = {"type": "function", "function": {"name": "get_weather"}}
            check_weather_call(
                api.chat.completions.create(
                    model=NAME, messages=messages, tools=[tool, TIME_TOOL], tool_choice=named, max_tokens=80
                )
                .choices[0]
                .message.tool_calls[0]
            )
            content, calls, reason = streamed_calls(
                api.chat.completions.create(
                    model=NAME, messages=messages, tools=[tool], tool_choice="required", max_tokens=80, stream=True
                )
            )
            assert reason == "tool_calls" and len(calls) == 1 and calls[0]["name"] == "get_weather", (content, calls)
        call = choice.message.tool_calls[0]
        messages += [
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "20 C"},
        ]
        final = api.chat.completions.create(model=NAME, messages=messages, tools=[WEATHER_TOOL], max_tokens=30)
        assert final.choices[0].finish_reason in ("stop", "length", "tool_calls")
        rendered_history = tokenizer.apply_chat_template(
            HermesFormat().prepare(
                [*messages[:2], {"role": "assistant", "content": "", "tool_calls": [call.model_dump()]}, messages[-1]],
                tools,
                ToolChoice("auto"),
            ),
            tools=[WEATHER_TOOL],
            tokenize=False,
            add_generation_prompt=True,
        )
        assert "<tool_response>\n20 C\n</tool_response>" in rendered_history and "<tool_call>" in rendered_history


@pytest.fixture(scope="module")
def smollm2_engine(smollm2_checkpoint, tmp_path_factory):
    home = tmp_path_factory.mktemp("smollm2-serve-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TR_HOME", str(home))
        yield Engine.open(DecodingOptions.parse(model=str(smollm2_checkpoint), device="cpu", dtype="float32"))


def test_smollm2_calls_a_tool_answers_from_its_result_and_extracts_json(smollm2_engine):
    """The real model through the official client: call -> result -> answer, and a JSON-schema
    extraction, both parsed and checked against their schemas."""
    from pydantic import BaseModel, Field

    with running(smollm2_engine) as server:
        api = client(server)
        messages = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
        first = api.chat.completions.create(
            model=NAME, messages=messages, tools=[WEATHER_TOOL], tool_choice="required", max_tokens=80, temperature=0
        )
        assert first.choices[0].finish_reason == "tool_calls"
        call = first.choices[0].message.tool_calls[0]
        check_weather_call(call)
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "clear"}'},
        ]
        final = api.chat.completions.create(
            model=NAME, messages=messages, tools=[WEATHER_TOOL], tool_choice="none", max_tokens=60, temperature=0
        )
        answer = final.choices[0].message
        assert answer.tool_calls is None and answer.content.strip()

        class Person(BaseModel):
            name: str = Field(max_length=40)
            age: int = Field(ge=0, le=130)
            city: str = Field(max_length=40)

        text = "Extract the person: Maria Lopez is 34 years old and lives in Valencia."
        parsed = api.chat.completions.parse(
            model=NAME,
            messages=[{"role": "user", "content": text}],
            response_format=Person,
            max_tokens=60,
            temperature=0,
        )
        person = parsed.choices[0].message.parsed
        assert isinstance(person, Person) and person.age == 34 and "Maria" in person.name


def test_a_nested_pydantic_tool_and_a_schema_beside_tools_not_offered(server):
    from pydantic import BaseModel, Field

    class Point(BaseModel):
        x: int = Field(ge=0, le=99)
        y: int = Field(ge=0, le=99)

    class Move(BaseModel):
        to: Point
        fast: bool

    api = client(server)
    tool = openai.pydantic_function_tool(Move)  # nested models: $defs and local $refs
    messages = [{"role": "user", "content": "Move to 3, 4."}]
    reply = api.chat.completions.create(
        model=NAME, messages=messages, tools=[tool], tool_choice="required", max_tokens=60
    )
    Move.model_validate_json(reply.choices[0].message.tool_calls[0].function.arguments)
    # tool_choice "none": no tools offered, so the response_format holds.
    response_format = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}
    plain = api.chat.completions.create(
        model=NAME, messages=messages, tools=[tool], tool_choice="none", response_format=response_format, max_tokens=60
    )
    assert set(json.loads(plain.choices[0].message.content)) == set(CITY["properties"])


def _job_allows(engine, body: dict, text: str) -> bool:
    """Whether the grammar of the job `body` becomes allows the reply `text` whole."""
    from tr_cli.core.constraint import ConstraintError

    job = served_model(engine).job(ChatCompletionRequest.model_validate(body), asyncio.new_event_loop())
    try:
        for token in engine.loaded.tokenizer.encode(text, add_special_tokens=False):
            job.constraint.advance(token)
    except ConstraintError:
        return False
    return job.constraint.allows(engine.loaded.eos_token_ids[0])


def test_schemas_that_do_not_mention_other_keys_or_bounds_are_read_closed_and_bounded(engine):
    """As llama.cpp and xgrammar read them by default: no invented keys, no key twice, no
    endless digits; JSON Schema's own reading when the request asks (open_schemas)."""
    loose = {"type": "object", "properties": {"city": {"type": "string"}, "people": {"type": "integer"}}}
    schema_format = {"type": "json_schema", "json_schema": {"name": "city", "schema": loose}}
    as_format = {"model": NAME, "messages": MESSAGES, "response_format": schema_format}
    tool = {"type": "function", "function": {"name": "f", "parameters": loose}}
    as_tool = {"model": NAME, "messages": MESSAGES, "tools": [tool], "tool_choice": "required"}
    for body, wrap in ((as_format, "{}"), (as_tool, '{{"tool_call": {{"name": "f", "arguments": {}}}}}')):
        assert _job_allows(engine, body, wrap.format('{"city": "Oslo", "people": 5}'))
        assert not _job_allows(engine, body, wrap.format('{"city": "Oslo", "type": "string"}'))
        assert not _job_allows(engine, body, wrap.format('{"city": "Oslo", "city": "Rome"}'))
        assert not _job_allows(engine, body, wrap.format('{"people": ' + "7" * 40 + "}"))
        assert _job_allows(engine, {**body, "open_schemas": True}, wrap.format('{"city": "Oslo", "type": "string"}'))
        assert _job_allows(engine, {**body, "open_schemas": True}, wrap.format('{"people": ' + "7" * 40 + "}"))


def test_null_n_and_stream_are_the_defaults(server):
    body = {"model": NAME, "messages": MESSAGES, "max_tokens": 3, "n": None, "stream": None}
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["object"] == "chat.completion"


def test_a_tool_call_cut_by_max_tokens_is_the_call_so_far_with_length(server):
    """As OpenAI returns it: the call's name and its arguments as far as they got, never tr's
    `{"tool_call": ...` wrapper as content; streamed the same way."""
    api = client(server)
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    for max_tokens in (20, 26):
        reply = api.chat.completions.create(
            model=NAME, messages=messages, tools=[WEATHER_TOOL], tool_choice=named, max_tokens=max_tokens
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "length" and not (choice.message.content or "").startswith("{")
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_weather" and call.id.startswith("call_")
        assert '"tool_call"' not in call.function.arguments
        content, calls, reason = streamed_calls(
            api.chat.completions.create(
                model=NAME,
                messages=messages,
                tools=[WEATHER_TOOL],
                tool_choice=named,
                max_tokens=max_tokens,
                stream=True,
            )
        )
        assert reason == "length" and content == "" and [c["name"] for c in calls] == ["get_weather"]
        assert calls[0]["arguments"] == call.function.arguments


@pytest.mark.parametrize("which", ["generic", "hermes"])
def test_a_call_cut_at_any_length_has_the_start_of_the_whole_calls_arguments(which, engine, hermes_engine):
    """Cut by max_tokens anywhere: no content, and once the name is whole a call whose arguments
    begin the whole call's (on Qwen2.5, max_tokens 12 gave the arguments ', "arguments":')."""
    served = engine if which == "generic" else hermes_engine
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    with running(served) as server:
        api = client(server)

        def ask(max_tokens: int):
            return api.chat.completions.create(
                model=NAME, messages=messages, tools=[WEATHER_TOOL], tool_choice=named, max_tokens=max_tokens
            )

        whole = ask(80)
        assert whole.choices[0].finish_reason == "tool_calls"
        arguments = whole.choices[0].message.tool_calls[0].function.arguments
        check_weather_call(whole.choices[0].message.tool_calls[0])
        cuts = [ask(max_tokens).choices[0] for max_tokens in range(1, whole.usage.completion_tokens)]
    for max_tokens, choice in enumerate(cuts, 1):
        assert choice.finish_reason == "length" and not choice.message.content, (max_tokens, choice)
        for call in choice.message.tool_calls or ():
            assert call.function.name == "get_weather", (max_tokens, call)
            assert arguments.startswith(call.function.arguments), (max_tokens, call.function.arguments, arguments)
    assert cuts[-1].message.tool_calls and cuts[-1].message.tool_calls[0].function.arguments == arguments


@pytest.mark.parametrize("which", ["generic", "hermes"])
def test_response_format_beside_tools_is_a_call_or_the_answer_it_asks_for(which, engine, hermes_engine):
    """openai-agents sends both when an agent has tools and an output type: the reply is a call,
    or the final JSON the format asks for (never free text)."""
    served = engine if which == "generic" else hermes_engine
    city = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"]}
    body = {
        "model": NAME,
        "messages": MESSAGES,
        "tools": [WEATHER_TOOL],
        "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": city}},
    }
    call = '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}'
    if which == "generic":
        as_call, answer, text = '{"tool_call": ' + call + "}", '{"response": {"city": "Oslo"}}', '{"response": "hi"}'
    else:
        as_call, answer, text = f"<tool_call>\n{call}\n</tool_call>", '{"city": "Oslo"}', "Hello there"
    assert _job_allows(served, body, as_call) and _job_allows(served, body, answer)
    assert not _job_allows(served, body, text) and not _job_allows(served, body, '{"city": "Oslo", "x": 1}')
    with running(served) as server:
        reply = client(server).chat.completions.create(**body, max_tokens=60)
    choice = reply.choices[0]
    if choice.finish_reason == "tool_calls":
        check_weather_call(choice.message.tool_calls[0])
    else:
        assert choice.finish_reason in ("stop", "length") and choice.message.tool_calls is None
        if choice.finish_reason == "stop":
            assert set(json.loads(choice.message.content)) == {"city"}
