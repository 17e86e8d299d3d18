"""tr: Token Recycling speculative decoding for transformers models."""

__version__ = "0.1.0"
