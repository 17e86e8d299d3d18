"""The draft steps a streamed reply carries when its request asks (`"tr": {"steps": true}`), on
a real decoder (a random-weight Llama with SmolLM2's tokenizer) behind the real app: the steps'
accepted tokens and the model's own tokens are the reply, token for token; their counts and
running MAT are the reply's statistics; every accepted token is a node of its step's tree with
that node's source; a request that does not ask (streamed, or a whole response that asks) gets
exactly what it got before. And the decoder's `nodes_by_source`, which names the sources, agrees
with its own `accepted_by_source` counts at every step."""

from __future__ import annotations

import json
import socket
import threading
import time

import openai
import pytest
import uvicorn
from starlette.testclient import TestClient

from tr_cli.core import StopCondition
from tr_cli.engine.engine import Engine
from tr_cli.engine.options import DecodingOptions
from tr_cli.serve.app import create_app
from tr_cli.serve.requests import ServedModel
from tr_cli.serve.worker import DecodeWorker

NAME = "tiny"
# The paper's tree (a designed one may be a single node on a busy CPU) and prompt lookup, on a
# prompt that repeats itself: two sources with something to draft.
MESSAGES = [{"role": "user", "content": "one two three four five, one two three four five, one two three"}]


@pytest.fixture(scope="module")
def engine(tiny_llama_dir, tmp_path_factory):
    home = tmp_path_factory.mktemp("steps-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TR_HOME", str(home))
        options = DecodingOptions.parse(model=str(tiny_llama_dir), device="cpu", dtype="float32", tree="paper+lookup10")
        yield Engine.open(options)


def served(engine) -> ServedModel:
    loaded = engine.loaded
    return ServedModel(
        name=NAME,
        aliases=frozenset(),
        tokenizer=loaded.tokenizer,
        generation_config=loaded.model.generation_config,
        context_length=loaded.context_length,
        max_depth=engine.decoder.max_depth,
        vocab_size=engine.decoder.vocab_size,
        stop_ids=tuple(loaded.eos_token_ids),
    )


def emitted_ids(steps: list[dict]) -> list[int]:
    """The tokens the steps emitted: each one's accepted drafts, then the model's own."""
    ids = []
    for step in steps:
        ids += [t["id"] for t in step["accepted"]] + ([step["bonus"]["id"]] if step["bonus"] else [])
    return ids


@pytest.fixture(scope="module")
def http(engine):
    loaded = engine.loaded
    model = served(engine)
    worker = DecodeWorker(engine.decoder, loaded.tokenizer, loaded.eos_token_ids)
    worker.start()
    with TestClient(create_app(model, worker)) as client:
        yield client
    worker.close(timeout=30)


def streamed(http: TestClient, **fields) -> list[dict]:
    body = {"model": NAME, "messages": MESSAGES, "max_tokens": 40, "stream": True, **fields}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def text_of(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def test_the_steps_spell_the_reply_and_its_statistics(engine, http):
    plain = streamed(http)
    chunks = streamed(http, tr={"steps": True})
    assert text_of(chunks) == text_of(plain)  # greedy: the same reply, asked or not
    steps = [c["tr"]["step"] for c in chunks if "step" in c.get("tr", {})]
    stats = chunks[-1]["tr"]
    assert [s["index"] for s in steps] == list(range(stats["steps"] + 1))  # the prefill, then every step
    assert steps[0]["tree"] == [] and steps[0]["accepted"] == [] and steps[0]["bonus"] is not None

    for step in steps:
        assert len(emitted_ids([step])) == step["new_tokens"]
        for token in step["accepted"]:  # each accepted token is its node's, with its node's source
            node = step["tree"][token["node"] - 1]
            assert (node["id"], node["source"]) == (token["id"], token["source"])
        assert sum(step["drafted"].values()) == len(step["tree"])
        assert all(0 <= node["parent"] <= n for n, node in enumerate(step["tree"]))
    tokenizer = engine.loaded.tokenizer
    assert tokenizer.decode(emitted_ids(steps), skip_special_tokens=True) == text_of(chunks)
    assert steps[-1]["mean_accepted_tokens"] == pytest.approx(stats["mean_accepted_tokens"], abs=1e-3)
    assert sum(len(s["accepted"]) for s in steps) > 0, "nothing drafted was accepted: the test shows nothing"
    # Every node names one of the sources this decoder drafts from (on the merged main the tiny
    # model's reply no longer repeats the prompt, so prompt lookup may draft nothing here).
    sources = {node["source"] for s in steps for node in s["tree"]}
    assert "matrix" in sources and sources <= {"matrix", "lookup"}


def test_a_client_that_does_not_ask_sees_no_steps_and_a_whole_response_never_has_them(http):
    for chunk in streamed(http)[:-1]:
        assert "tr" not in chunk
    body = {"model": NAME, "messages": MESSAGES, "max_tokens": 8, "tr": {"steps": True}}
    whole = http.post("/v1/chat/completions", json=body).json()
    assert set(whole["tr"]) >= {"steps", "mean_accepted_tokens"} and isinstance(whole["tr"]["steps"], int)
    assert "step" not in whole["tr"]


def test_the_openai_client_reads_a_stream_with_steps_as_any_stream(engine):
    """Through the official SDK on a real socket: the chunks parse, the text is the reply, and
    the steps are in each chunk's extra fields."""
    loaded = engine.loaded
    model = served(engine)
    worker = DecodeWorker(engine.decoder, loaded.tokenizer, loaded.eos_token_ids)
    worker.start()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    server = uvicorn.Server(uvicorn.Config(create_app(model, worker), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.02)
        sdk = openai.OpenAI(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}/v1", api_key="-", max_retries=0)
        stream = sdk.chat.completions.create(
            model=NAME, messages=MESSAGES, max_tokens=12, stream=True, extra_body={"tr": {"steps": True}}
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        steps = [c.model_extra["tr"]["step"] for c in chunks if "step" in (c.model_extra.get("tr") or {})]
        assert steps and steps[0]["index"] == 0
        assert loaded.tokenizer.decode(emitted_ids(steps), skip_special_tokens=True) == text
    finally:
        server.should_exit = True
        thread.join(30)
        worker.close(timeout=30)


def test_nodes_by_source_names_the_accepted_nodes_the_counts_count(engine):
    decoder = engine.decoder
    tokenizer = engine.loaded.tokenizer
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    decoder.reset()
    stop = StopCondition.build(48, engine.loaded.eos_token_ids, ())
    checked = 0
    for event in decoder.steps(list(prompt), stop):
        if event.step == 0:
            assert event.nodes_by_source == {}
            continue
        counted: dict[str, int] = {}
        for name, nodes in event.nodes_by_source.items():
            hits = len(set(event.accepted_nodes) & {n for n in nodes if n > 0})
            if hits:
                counted[name] = hits
        assert counted == event.accepted_by_source, event.step
        listed = {n for nodes in event.nodes_by_source.values() for n in nodes if n > 0}
        assert listed == set(range(1, len(event.tree_tokens))), "a node no source drafted"
        checked += 1
    assert checked > 0
    decoder.reset()
