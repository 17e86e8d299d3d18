"""Starter state shipped with tr (package data): for a tokenizer with no stored matrix yet, a
matrix named as its default file (`<fingerprint>-v<vocab>-k<k>.safetensors`), optionally with its
recycled store (`.store.safetensors`) and acceptance statistics (`.accept.json`). See docs/matrix.md."""
