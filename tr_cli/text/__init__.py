"""Text and tokens: the one conversation encoder, streaming detokenization, prompt files, corpora."""
