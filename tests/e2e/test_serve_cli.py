"""`tr serve` as a process, the way a user runs it: SIGTERM and SIGINT stop it with status 0 and
the matrix saved (idle, and in the middle of a streamed reply), it listens on loopback only by
default, an API key (from TR_API_KEY) guards /v1 but not /health, a port in use is a one-line
error before any model loads, and on the packaged model a two-turn chat through the OpenAI SDK
is exactly `model.generate`'s greedy output, the second turn reusing the first turn's cache."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

BIN = Path(sys.executable).parent
LISTENING = re.compile(r"tr serve: listening on (http://\S+/v1) \(model '")
SAVED = re.compile(r"matrix: [\d,]+ rows saved to (\S+\.safetensors)")
START_TIMEOUT = 120  # seconds from the command to the listening line (the tiny model takes ~10)
API_KEY = "sk-test-4f9c2e"
# The paper's tree: no step-cost measurement at start (half the start time of the default tree).
TINY_ARGS = ("--dtype", "float32", "--max-new-tokens", "24", "--tree", "paper")


def environment(home: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TR_API_KEY")}
    return {**env, "HF_HUB_OFFLINE": "1", "TR_HOME": str(home), "COLUMNS": "200", "NO_COLOR": "1", **extra}


@dataclass
class Server:
    """A running `tr serve` whose stderr goes to a file (read it with `stderr()`)."""

    proc: subprocess.Popen
    base_url: str  # http://127.0.0.1:PORT/v1
    log: Path

    @property
    def host(self) -> str:
        return urlsplit(self.base_url).hostname

    @property
    def port(self) -> int:
        return urlsplit(self.base_url).port

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: signal.Signals, timeout: float = 60) -> int:
        """Send the signal and wait for the exit status."""
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"tr serve still runs {timeout} s after {sig.name}; stderr:\n{self.stderr()}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def start_server(args: list[str], home: Path, log: Path, timeout: float = START_TIMEOUT, **env: str) -> Server:
    """`tr serve ARGS --port 0`, waited for until it says it listens."""
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [str(BIN / "tr"), "serve", *args, "--port", "0"],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=sink,
            env=environment(home, **env),
            start_new_session=True,  # signals from the terminal running pytest do not reach it
        )
    deadline = time.monotonic() + timeout
    while True:
        text = log.read_text(errors="replace")
        found = LISTENING.search(text)
        if found:
            return Server(proc, found.group(1), log)
        if proc.poll() is not None:
            pytest.fail(f"tr serve exited with status {proc.returncode} before listening; stderr:\n{text}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait(30)
            pytest.fail(f"tr serve did not listen within {timeout} s; stderr:\n{text}")
        time.sleep(0.1)


@pytest.fixture()
def servers(home, tmp_path):
    """Start servers on this test's TR_HOME; whatever still runs at the end is killed."""
    started: list[Server] = []

    def start(*args: str, timeout: float = START_TIMEOUT, **env: str) -> Server:
        server = start_server(list(args), home, tmp_path / f"serve-{len(started)}.log", timeout, **env)
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


@pytest.fixture(scope="module")
def keyed_server(tiny_llama_dir, tmp_path_factory):
    """One server on the tiny model for the tests that leave no state behind, its key from the
    environment (TR_API_KEY), its host the default."""
    root = tmp_path_factory.mktemp("serve-keyed")
    (root / "home").mkdir()
    server = start_server([str(tiny_llama_dir), *TINY_ARGS], root / "home", root / "serve.log", TR_API_KEY=API_KEY)
    yield server
    server.kill()


def request(
    url: str, method: str = "GET", body: dict | None = None, headers: dict | None = None, timeout: float = 60
) -> tuple[int, bytes]:
    """One raw HTTP request: (status, body)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        sent = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, parts.path, body=data, headers={**sent, **(headers or {})})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def matrices(home: Path) -> dict[Path, int]:
    """The matrix files under TR_HOME and their modification times."""
    return {path: path.stat().st_mtime_ns for path in (home / "data" / "matrices").glob("*.safetensors")}


def assert_matrix_saved(server: Server, home: Path, before: dict[Path, int]) -> None:
    """stderr names the saved matrix; the file is under TR_HOME, written after `before` was
    taken, and loads."""
    from safetensors.torch import load_file

    stderr = server.stderr()
    saved = SAVED.findall(stderr)
    assert saved, stderr
    path = Path(saved[-1])
    assert path.parent == home / "data" / "matrices", stderr
    after = matrices(home)
    assert path in after, (sorted(after), stderr)
    assert after[path] > before.get(path, -1), "the matrix file was not written at shutdown"
    tensors = load_file(path)
    assert tensors and all(t.numel() > 0 for t in tensors.values())


def openai_client(server: Server, api_key: str = "unused", **options):
    from openai import OpenAI

    return OpenAI(base_url=server.base_url, api_key=api_key, max_retries=0, timeout=120, **options)


# -- stopping ----------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_while_idle_saves_the_matrix_and_exits_0(sig, servers, home, tiny_llama_dir):
    server = servers(str(tiny_llama_dir), *TINY_ARGS)
    client = openai_client(server)
    reply = client.chat.completions.create(
        model=str(tiny_llama_dir), messages=[{"role": "user", "content": "Hello there"}], max_tokens=16
    )
    assert reply.usage.completion_tokens > 0
    before = matrices(home)
    assert server.stop(sig) == 0, server.stderr()
    stderr = server.stderr()
    assert "Traceback" not in stderr, stderr
    assert re.search(r"tr serve: stopped after 1 request ", stderr), stderr
    assert_matrix_saved(server, home, before)


def read_events(response: http.client.HTTPResponse):
    """The server-sent events of a streamed response as they come: parsed JSON, or "[DONE]"."""
    while True:
        line = response.readline()
        if not line:
            return
        line = line.strip()
        if line.startswith(b"data: "):
            payload = line[len(b"data: ") :]
            yield "[DONE]" if payload == b"[DONE]" else json.loads(payload)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_during_a_streamed_reply(sig, servers, home, tiny_llama_dir):
    """SIGTERM (a service manager) or SIGHUP (the terminal closed): the reply stops between two
    steps, the stream ends with an error event (or the whole reply if it happened to end first),
    the process exits 0 soon after, and the matrix is saved."""
    server = servers(str(tiny_llama_dir), "--dtype", "float32", "--max-new-tokens", "2000", "--tree", "paper")
    body = {
        "model": str(tiny_llama_dir),
        "messages": [{"role": "user", "content": "Tell me a very long story about the sea, the wind and the stars."}],
        "max_tokens": 2000,
        "stream": True,
    }
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    try:
        headers = {"Content-Type": "application/json"}
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=headers)
        response = conn.getresponse()
        assert response.status == 200
        events = read_events(response)
        seen: list = []
        deltas = 0
        for event in events:  # until the reply is streaming
            seen.append(event)
            if event == "[DONE]" or "error" in event:
                break
            deltas += bool(event["choices"] and event["choices"][0]["delta"].get("content"))
            if deltas == 3:
                break
        before = matrices(home)
        server.proc.send_signal(sig)
        signalled = time.monotonic()
        with contextlib.suppress(http.client.IncompleteRead, ConnectionError):
            seen.extend(events)  # to the end of the stream
        stream_seconds = time.monotonic() - signalled
    finally:
        conn.close()
    try:
        status = server.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"tr serve still runs 30 s after {sig.name}; stderr:\n{server.stderr()}")
    stderr = server.stderr()
    assert status == 0, stderr
    assert stream_seconds < 30, stderr
    assert "Traceback" not in stderr, stderr
    last = seen[-1]
    if last == "[DONE]":  # the reply ended before the signal arrived: a whole stream
        assert any(e != "[DONE]" and e.get("choices") and e["choices"][0]["finish_reason"] for e in seen)
    else:  # cut: an OpenAI error event says why
        assert isinstance(last, dict) and "error" in last, f"the stream ended without a last event: {last}"
        assert last["error"]["code"] == "unavailable", last
        assert "shutting down" in last["error"]["message"], last
        assert "cut after" in stderr, stderr
    assert_matrix_saved(server, home, before)


# -- where it listens and who may use it ---------------------------------------------------------


def non_loopback_ipv4() -> str | None:
    """An IPv4 address of this machine that is not loopback and that a socket can listen on."""
    candidates = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        with contextlib.suppress(OSError):
            probe.connect(("10.255.255.255", 1))  # no packet is sent; it picks the outgoing address
            candidates.append(probe.getsockname()[0])
    with contextlib.suppress(OSError):
        candidates.append(socket.gethostbyname(socket.gethostname()))
    for address in candidates:
        if address.startswith("127.") or address == "0.0.0.0":
            continue
        try:  # reachable here: a listener of our own on it takes a connection
            with socket.create_server((address, 0)) as listener:
                socket.create_connection(listener.getsockname(), timeout=5).close()
        except OSError:
            continue
        return address
    return None


def test_default_bind_is_loopback_only(keyed_server):
    address = non_loopback_ipv4()
    if address is None:
        pytest.skip("this machine has no usable non-loopback IPv4 address")
    assert keyed_server.host == "127.0.0.1"
    status, body = request(f"http://127.0.0.1:{keyed_server.port}/health")
    assert status == 200 and json.loads(body)["status"] == "ok"
    with pytest.raises((ConnectionRefusedError, TimeoutError)):
        socket.create_connection((address, keyed_server.port), timeout=5).close()


def assert_openai_error(status: int, body: bytes, expected_status: int) -> dict:
    assert status == expected_status, body
    error = json.loads(body)["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert {"param", "code"} <= error.keys()
    return error


@pytest.mark.parametrize(
    "method, path, headers",
    [
        ("GET", "/v1/models", {}),
        ("GET", "/v1/models", {"Authorization": "Bearer wrong-key"}),
        ("POST", "/v1/chat/completions", {}),
        ("POST", "/v1/chat/completions", {"Authorization": f"Bearer {API_KEY}x"}),
        ("POST", "/v1/completions", {"Authorization": API_KEY}),  # no "Bearer"
        ("GET", "/metrics", {}),
    ],
    ids=["models-no-key", "models-wrong-key", "chat-no-key", "chat-wrong-key", "completions-no-scheme", "metrics"],
)
def test_api_key_from_the_environment_is_required(method, path, headers, keyed_server):
    logged = f'"{method} {path}" 401'  # the access log's line, written once the response is sent
    lines_before = keyed_server.stderr().count(logged)
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}]} if method == "POST" else None
    status, raw = request(keyed_server.base_url.removesuffix("/v1") + path, method, body, headers)
    error = assert_openai_error(status, raw, 401)
    assert error["code"] == "invalid_api_key"
    deadline = time.monotonic() + 10
    while keyed_server.stderr().count(logged) == lines_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert keyed_server.stderr().count(logged) == lines_before + 1, keyed_server.stderr()


def test_api_key_health_is_open_and_the_sdk_works_with_the_key(keyed_server):
    import openai

    status, body = request(keyed_server.base_url.removesuffix("/v1") + "/health")
    assert status == 200 and json.loads(body)["status"] == "ok"

    with pytest.raises(openai.AuthenticationError):
        openai_client(keyed_server, api_key="not-the-key").models.list()

    client = openai_client(keyed_server, api_key=API_KEY)
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hello there"}], max_tokens=8, temperature=0
    )
    assert reply.choices[0].message.role == "assistant"
    assert isinstance(reply.choices[0].message.content, str)
    assert 1 <= reply.usage.completion_tokens <= 8
    assert reply.choices[0].finish_reason in ("stop", "length")
    chunks = list(
        client.completions.create(model=model, prompt="Once upon a time", max_tokens=6, temperature=0, stream=True)
    )
    assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_port_in_use_is_a_one_line_error_before_the_model_loads(home, tiny_llama_dir):
    with socket.create_server(("127.0.0.1", 0)) as taken:  # bound and listening
        port = taken.getsockname()[1]
        begin = time.monotonic()
        out = subprocess.run(
            [str(BIN / "tr"), "serve", str(tiny_llama_dir), *TINY_ARGS, "--port", str(port)],
            capture_output=True,
            text=True,
            env=environment(home),
            stdin=subprocess.DEVNULL,
            timeout=300,
        )
        seconds = time.monotonic() - begin
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tr: error: --port {port}"), out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    assert "Loading" not in out.stderr  # nothing was loaded
    assert not matrices(home)
    assert seconds < 60, f"{seconds:.1f} s to refuse a port in use"


# -- the packaged model ----------------------------------------------------------------------------


def greedy(loaded, messages: list[dict], max_new_tokens: int) -> str:
    """model.generate's greedy reply to the conversation, as tr encodes it (the template's text,
    tokenized without added special tokens), cut at the first EOS."""
    import torch

    text = loaded.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = list(loaded.tokenizer.encode(text, add_special_tokens=False))
    with torch.inference_mode():
        full = loaded.model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=loaded.eos_token_ids[0],
        )
    reply = full[0, len(ids) :].tolist()
    for i, token in enumerate(reply):
        if token in loaded.eos_token_ids:
            reply = reply[:i]
            break
    return loaded.tokenizer.decode(reply, skip_special_tokens=True)


def test_two_turn_chat_is_greedy_generate_with_the_cache_reused(smollm2_fp32, smollm2_checkpoint, servers):
    # The paper's 80-node tree: drafts that get verified (the tree designed for a busy CPU can be a
    # single node, i.e. no drafts), and no step-cost measurement at start (minutes on a small CPU).
    server = servers(str(smollm2_checkpoint), "--dtype", "float32", "--tree", "paper", timeout=600)
    client = openai_client(server)
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "Name three primary colors."}]

    first = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=40)
    answer = first.choices[0].message.content
    assert answer == greedy(smollm2_fp32, messages, 40)

    messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Which one is the warmest?"}]
    second = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=40)
    assert second.choices[0].message.content == greedy(smollm2_fp32, messages, 40)
    stats = second.model_extra["tr"]
    assert stats["prompt_tokens_reused"] > 0, stats
    assert stats["prefill_tokens"] == second.usage.prompt_tokens - stats["prompt_tokens_reused"]
    assert first.model_extra["tr"]["prompt_tokens_reused"] == 0
