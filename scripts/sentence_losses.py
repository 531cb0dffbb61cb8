"""Write ``losses.<split>.tsv`` into runs evaluated before evaluation kept each sentence's loss:
``python scripts/sentence_losses.py RUN_OR_SWEEP... [--splits test]``; see
:mod:`posenc.evaluation.backfill_losses`."""

from posenc.evaluation.backfill_losses import main

if __name__ == "__main__":
    raise SystemExit(main())
