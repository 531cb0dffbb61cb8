"""The report of a sweep: tables, figures and a CSV from the run directories of a multirun.

``python scripts/report.py SWEEP_DIR [--out DIR] [--split test] [--bootstrap 1000] [--eval NAME]
[--reference NAME]`` reads every directory under ``SWEEP_DIR`` that holds a ``config.yaml`` (Hydra
puts each job of a multirun in ``SWEEP_DIR/<override_dirname>/``) and writes into ``--out``
(default ``SWEEP_DIR/report``); scores come from each run's own evaluation, or with ``--eval
NAME`` from its standalone evaluation ``RUN/evals/NAME/`` (see :mod:`posenc.evaluation`):

- ``report.md``: a reading (one paragraph, also in ``reading.txt``: what the significance tests
  say and how far to trust them, see :mod:`.reading`), then runs and their status,
  learning curves, scores, significance, length buckets, cost and attention maps, every split of
  the metrics (the focus split ``--split`` first);
- ``*.png``: the figures the report shows;
- ``SWEEP_DIR/hparams-HASH/``: the sweep's TensorBoard experiment summary, rewritten (see
  :mod:`posenc.runtime.hparams`);
- ``report.csv``: every number of the tables, long format ``section,split,encoding,run,metric,
  value`` (``run`` is empty for a mean over seeds).

Runs are grouped by encoding (``pe.name``, plus any other training setting that differs between
the runs, run-control settings such as the seed aside: ``posenc.config.RUN_CONTROL_KEYS``). A
failed run (``failed.json``) or an unfinished one (no ``metrics.json`` yet) is listed with its
status, never dropped, and its curves so far are plotted. The shared setup is read from the runs'
own configs, one line per config group; the training length limits named on the length-bucket
figure are the keys of ``posenc.config.LENGTH_LIMITS`` the configs set (drawn when they count
tokens, converted to the axis' tokens incl. EOS); cost ratios are measured
against the runs' ``reference_pe`` (``configs/train.yaml``) or ``--reference NAME``.

Significance is the decision rule of :mod:`posenc.analysis.decision` (its unit the training run,
the test sentences a second noise), every system against the one with the best mean BLEU, one
family per report corrected with Holm's method (:mod:`.findings`). A held-out set that shares
sentences with the runs' training pairs is also scored on its clean part (:mod:`.clean`).

Modules, each with one job (import from them directly):

- :mod:`.runs`: reading run directories into :class:`~.runs.Run` objects and grouping them;
- :mod:`.stats`: the numbers (means over seeds, buckets and limits, cost);
- :mod:`.findings`: when a difference is a finding; :mod:`.clean`: held-out sets' clean parts;
- :mod:`.curves`: learning curves over seeds (a mean only where every seed has data);
- :mod:`.render`: the markdown/CSV writer, number formatting and figure helpers;
- :mod:`.figures`: the report's figures;
- :mod:`.sections_by_encoding`: sections 1, 2, 6 and 7 (runs, curves, cost, attention);
- :mod:`.sections_by_split`: sections 3 to 5 (scores, significance, length buckets) per split;
- :mod:`.build`: the whole report and the command line (``main``).
"""
