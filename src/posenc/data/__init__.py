"""Sentence pairs in: corpora, cleaning and held-out sets, tokenizers, token-bucketed batches."""
