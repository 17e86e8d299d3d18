"""llama.cpp as a bench method: the program a CPU user already runs, on the same GGUF file.

It runs in this process through llama-cpp-python (the optional extra `tr-cli[llamacpp]`), on
the very token ids every other method gets (the GGUF's vocabulary is the tokenizer's, so the
chat template is applied once, by us), greedy, with torch's thread count, and is timed like the
others: prefill plus decoding of each turn, no prompt cache kept between runs. Its tokens come
from its own Q4 kernels, so they are never compared with `generate`'s.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import torch

from ..errors import SettingError
from .run import Run

LLAMA_CPP = "llama.cpp"
EXTRA = "pip install 'tr-cli[llamacpp]' (docs/benchmarks.md: build it for this CPU)"


def check_available(method: str) -> None:
    """SettingError unless llama-cpp-python can be imported: said before any model loads."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise SettingError("methods", method, f"needs llama-cpp-python, not installed here; {EXTRA}")


def llama_cpp_version() -> str:
    """'llama-cpp-python 0.3.36 (AVX2 = 1, ...)': the version and what its build uses, for reports."""
    import llama_cpp

    features = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    return f"llama-cpp-python {llama_cpp.__version__} ({features})"


class LlamaCpp:
    """One llama.cpp context over `gguf`, reset before every run."""

    def __init__(self, gguf: Path, eos_token_ids: list[int], context: int) -> None:
        from llama_cpp import Llama

        threads = torch.get_num_threads()
        self.llm = Llama(
            str(gguf), n_ctx=context, n_threads=threads, n_threads_batch=threads, n_batch=512, verbose=False, seed=0
        )
        self.eos = set(eos_token_ids)

    def run(self, ids: list[int], max_new_tokens: int) -> Run:
        tokens: list[int] = []
        self.llm.reset()  # no prefix reuse: every method prefills the whole turn
        start = time.perf_counter()
        if max_new_tokens > 0:
            for token in self.llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
                tokens.append(int(token))
                if token in self.eos or len(tokens) >= max_new_tokens:
                    break
        seconds = time.perf_counter() - start
        return Run(tokens, seconds, max(len(tokens) - 1, 0))
