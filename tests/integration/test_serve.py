"""`tr serve`'s app on a real uvicorn server on a free loopback port, driven by the official
`openai` client and raw HTTP: replies equal `model.generate`'s greedy reply for the rendered
prompt (streamed and not, chat and text completions, later turns from the KV cache, a rewound
branch), stop strings, seeded sampling, the queue bound (429), concurrent clients, disconnects,
every kind of bad request, the API key. The model is a random-weight Llama speaking through
SmolLM2's tokenizer and chat template."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx2 as httpx  # the HTTP client openai itself uses
import openai
import pytest
import torch
import uvicorn

from tr_cli.engine.engine import Engine
from tr_cli.engine.options import DecodingOptions
from tr_cli.serve.app import create_app
from tr_cli.serve.requests import ServedModel
from tr_cli.serve.worker import DecodeWorker

from tiny_models import reference

NAME = "tiny"


class Server:
    """uvicorn serving an app in a thread, on a port of its own."""

    def __init__(self, app) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
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
        **extra,
    )


@contextmanager
def running(engine, start_worker: bool = True, queue_size: int = 8, api_key: str | None = None, max_body: int = 65536):
    """The app over the module's engine (its decoder keeps the last conversation between tests)."""
    worker = DecodeWorker(engine.decoder, engine.loaded.tokenizer, engine.loaded.eos_token_ids, queue_size=queue_size)
    app = create_app(served_model(engine), worker, api_key=api_key, max_body=max_body)
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
    assert whole.usage.completion_tokens == len(tokens)
    assert whole.usage.total_tokens == len(ids) + len(tokens)
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
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(tokens)
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
            assert int(refused.headers["Retry-After"]) >= 1
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


def test_a_client_leaving_mid_stream_frees_the_slot(engine, server):
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

    worker = DecodeWorker(engine.decoder, engine.loaded.tokenizer, engine.loaded.eos_token_ids, save=save, save_every=0)
    with Server(create_app(served_model(engine), worker)) as server:
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
