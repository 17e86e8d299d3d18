"""A GGUF's transformers config and tokenizer, read without parsing its vocabulary twice.

transformers reads most architectures' config from a GGUF with gguf's GGUFReader, which makes numpy
views of every string of the vocabulary: ~12 s a read for a 151,936-token vocabulary on a 2-core
EPYC, and AutoTokenizer reads the config again before its own (fast) vocabulary reader runs. Here
transformers' own config code runs on a copy of the header whose long arrays (the vocabulary's
tokens, merges, types and scores; no config key reads them) are emptied: a few KB, parsed in
milliseconds. The tokenizer is then built by transformers' fast GGUF tokenizer reader into the class
AutoTokenizer picks for that config. Where this transformers has no fast tokenizer reader,
`fast_side_files` says so (None) and the caller takes transformers' own route.
"""

from __future__ import annotations

import mmap
import os
import struct
import tempfile
from pathlib import Path

from .gguf_header import ALIGNMENT, GGUFHeader

# Arrays longer than this are a vocabulary's; per-layer arrays (head counts, window patterns) have
# one item a layer.
LONG_ARRAY = 4096
_F32 = 0


def stripped_header(path: Path, header: GGUFHeader, longest: int = LONG_ARRAY) -> bytes:
    """A whole GGUF file of the header's metadata, arrays longer than `longest` emptied (their item
    type kept), and each tensor of the table as one float32 under its own name: what transformers'
    config code reads (names for tied embeddings and biases), with nothing of the vocabulary."""
    out = bytearray()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        out += buf[:24]  # magic, version, tensor count, metadata count
        for key, start, end in header.spans:
            if header.array_lengths.get(key, 0) > longest:
                key_end = start + 8 + struct.unpack_from("<Q", buf, start)[0]
                out += buf[start : key_end + 8]  # key, value type (array), item type
                out += struct.pack("<Q", 0)
            else:
                out += buf[start:end]
    alignment = header.values.get("general.alignment", ALIGNMENT)
    for index, tensor in enumerate(header.tensors):
        name = tensor.name.encode()
        out += struct.pack("<Q", len(name)) + name + struct.pack("<IQIQ", 1, 1, _F32, index * alignment)
    out += bytes(-len(out) % alignment + len(header.tensors) * alignment)
    return bytes(out)


def config_dict(path: Path, header: GGUFHeader, scratch: Path, longest: int = LONG_ARRAY) -> dict:
    """transformers' config dict for the GGUF (what AutoConfig reads from it), its legacy reader run on
    `stripped_header` in a file under `scratch`."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    try:  # transformers >= 5.2x: a fast reader of its own for a few architectures
        from transformers.integrations.gguf import GGUF_CONFIG_ARCHS, get_gguf_config, read_gguf_metadata
    except ImportError:
        GGUF_CONFIG_ARCHS = {}
    if header.architecture in GGUF_CONFIG_ARCHS:
        return get_gguf_config(*read_gguf_metadata(str(path)))
    handle, name = tempfile.mkstemp(prefix=".header-", suffix=".gguf", dir=scratch)
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(stripped_header(path, header, longest))
        config = load_gguf_checkpoint(name, return_tensors=False)["config"]
    finally:
        os.unlink(name)
    if config.get("vocab_size") == 0:  # transformers' fallback: the number of tokens, emptied here
        config["vocab_size"] = header.array_lengths.get("tokenizer.ggml.tokens", 0)
    return config


def fast_side_files(path: Path, header: GGUFHeader, scratch: Path, longest: int = LONG_ARRAY):
    """(config, tokenizer) as AutoConfig and AutoTokenizer make them from the GGUF, each file read
    once; None where this transformers has no fast GGUF tokenizer reader."""
    try:
        from transformers.integrations.gguf import get_gguf_tokenizer  # noqa: F401 (the fast reader)
    except ImportError:
        return None
    from transformers import AutoConfig, TokenizersBackend
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING

    config = AutoConfig.for_model(**config_dict(path, header, scratch, longest))
    # AutoTokenizer's choice for a GGUF (no tokenizer_config.json): the config's class, else the
    # generic backend; Mistral's own backend needs files a GGUF does not have.
    tokenizer_class = TOKENIZER_MAPPING.get(type(config), None) or TokenizersBackend
    if tokenizer_class.__name__ == "MistralCommonBackend":
        tokenizer_class = TokenizersBackend
    tokenizer = tokenizer_class.from_pretrained(str(path.parent), gguf_file=path.name)
    return config, tokenizer
