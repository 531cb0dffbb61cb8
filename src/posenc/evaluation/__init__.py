"""A trained run scored: decoding, BLEU/chrF/BERTScore, length buckets, attention maps and
the standalone ``python -m posenc.evaluation`` command."""
