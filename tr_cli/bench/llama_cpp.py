"""llama.cpp as bench methods: the program a CPU user already runs, on the same GGUF file.

- `llama.cpp`: plain decoding, in this process through llama-cpp-python (the optional extra
  `tr-cli[llamacpp]`).
- `llama.cpp+ngram`: llama.cpp's draftless speculation, `llama-server --spec-default` (its
  `ngram-mod` pool of hashed n-grams, shared across requests), run once per bench on loopback;
  the binary is `llama-server` on PATH or $TR_LLAMA_SERVER (built from the llama.cpp sources
  vendored in the llama-cpp-python sdist).

Both get the very token ids every other method gets (the GGUF's vocabulary is the tokenizer's,
so the chat template is applied once, by us), decode greedy with torch's thread count, and are
timed like the others: prefill plus decoding of each turn, no prompt cache kept between runs.
Their tokens come from llama.cpp's own Q4 kernels, so they are never compared with `generate`'s.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import torch

from ..errors import SettingError
from .run import Run

LLAMA_CPP = "llama.cpp"
LLAMA_CPP_NGRAM = "llama.cpp+ngram"
LLAMA_CPP_METHODS = (LLAMA_CPP, LLAMA_CPP_NGRAM)
EXTRA = "pip install 'tr-cli[llamacpp]', built for this CPU as docs/benchmarks.md's 'llama.cpp, the reference' says"
SERVER_VARIABLE = "TR_LLAMA_SERVER"
_SERVER_START_SECONDS = 120


def check_available(method: str) -> None:
    """SettingError unless what `method` runs is installed: said before any model loads."""
    if method == LLAMA_CPP and importlib.util.find_spec("llama_cpp") is None:
        raise SettingError("methods", method, f"needs llama-cpp-python, not installed here; {EXTRA}")
    if method == LLAMA_CPP_NGRAM and server_binary() is None:
        raise SettingError(
            "methods",
            method,
            f"needs llama-server (llama.cpp's server): put it on PATH or set {SERVER_VARIABLE} to its path",
        )


def server_binary() -> str | None:
    given = os.environ.get(SERVER_VARIABLE)
    if given:
        return given if Path(given).is_file() and os.access(given, os.X_OK) else None
    return shutil.which("llama-server")


def llama_cpp_version(methods: list[str]) -> str:
    """What ran, for reports: llama-cpp-python's version and build features, the server's version."""
    parts = []
    if LLAMA_CPP in methods:
        import llama_cpp

        features = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
        parts.append(f"llama-cpp-python {llama_cpp.__version__} ({features})")
    if LLAMA_CPP_NGRAM in methods:
        binary = server_binary()
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
        version = next((line for line in (out.stdout + out.stderr).splitlines() if "version" in line), "?")
        parts.append(f"llama-server --spec-default ({version.strip()})")
    return "; ".join(parts)


def _no_schema(grammar: object, name: str) -> None:
    if grammar is not None:
        raise SettingError("methods", name, "is compared on free text only; drop it for prompts with a schema")


class LlamaCpp:
    """One llama.cpp context over `gguf`, reset before every run."""

    def __init__(self, gguf: Path, eos_token_ids: list[int], context: int) -> None:
        from llama_cpp import Llama

        threads = torch.get_num_threads()
        self.llm = Llama(
            str(gguf), n_ctx=context, n_threads=threads, n_threads_batch=threads, n_batch=512, verbose=False, seed=0
        )
        self.eos = set(eos_token_ids)

    def run(self, ids: list[int], max_new_tokens: int, grammar: object = None) -> Run:
        _no_schema(grammar, "llama.cpp")
        tokens: list[int] = []
        self.llm.reset()  # no prefix reuse: every method prefills the whole turn
        start = time.perf_counter()
        first = None
        if max_new_tokens > 0:
            for token in self.llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
                first = first if first is not None else time.perf_counter() - start
                tokens.append(int(token))
                if token in self.eos or len(tokens) >= max_new_tokens:
                    break
        seconds = time.perf_counter() - start
        steps = max(len(tokens) - 1, 0)
        return Run(tokens, seconds, steps, tokens_per_step=Counter({1: steps}), first_token_seconds=first)


class LlamaServer:
    """`llama-server --spec-default` on a free loopback port, for the bench's lifetime."""

    def __init__(self, gguf: Path, eos_token_ids: list[int], context: int) -> None:
        threads = str(torch.get_num_threads())
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        command = [server_binary(), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port)]
        command += ["-t", threads, "-tb", threads, "-c", str(context), "-np", "1", "--spec-default"]
        # Its log goes to a file, not a pipe: it logs every request, and a full pipe nobody reads
        # would stop the server in the middle of a long bench.
        self._log = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=self._log, text=True)
        atexit.register(self.close)
        self.eos = set(eos_token_ids)
        self._wait_until_ready()

    def _url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + _SERVER_START_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self._log.seek(0)
                last = self._log.read().strip().splitlines()[-1:] or ["no output"]
                raise SettingError("methods", LLAMA_CPP_NGRAM, f"llama-server exited: {last[0]}")
            try:
                with urllib.request.urlopen(self._url("/health"), timeout=5) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        self.close()
        raise SettingError("methods", LLAMA_CPP_NGRAM, f"llama-server not ready after {_SERVER_START_SECONDS} s")

    def run(self, ids: list[int], max_new_tokens: int, grammar: object = None) -> Run:
        _no_schema(grammar, LLAMA_CPP_NGRAM)
        body = {
            "prompt": ids,
            "n_predict": max_new_tokens,
            "temperature": 0.0,
            "top_k": 1,
            "repeat_penalty": 1.0,
            "cache_prompt": False,  # every method prefills the whole turn
            "return_tokens": True,
            "stream": False,
        }
        request = urllib.request.Request(
            self._url("/completion"), json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        start = time.perf_counter()
        with urllib.request.urlopen(request, timeout=3600) as reply:
            answer = json.load(reply)
        seconds = time.perf_counter() - start
        tokens = [int(t) for t in answer.get("tokens", [])][:max_new_tokens]
        timings = answer.get("timings", {})
        # A verification forward emits its accepted drafts plus one token: the forwards after the
        # prefill's token are the tokens not accepted from drafts.
        accepted = int(timings.get("draft_n_accepted", 0) or 0)
        # Its own clock of the decoding after the first token; the rest (prefill, HTTP) comes first.
        decoding = timings.get("predicted_ms")
        first = None if decoding is None else max(seconds - float(decoding) / 1000, 0.0)
        return Run(tokens, seconds, max(len(tokens) - 1 - accepted, 0), first_token_seconds=first)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self._log.close()
