"""Speed of every positional encoding: a training step and cached greedy decoding, as ratios to
the reference encoding (``reference_pe`` in ``configs/train.yaml``) measured in the same run
(``scripts/bench.py``).

Modules: :mod:`.runner` (workloads, timing, memory, summary, targets), :mod:`.measure`
(clocks, machine facts, resident-set probes), :mod:`.render` (the markdown tables),
:mod:`.cli` (the command line), :mod:`.peers` (``--peers``: other implementations timed in the
same repetitions; their models in :mod:`.peer_models` and :mod:`.seed_model`).

What is timed, per encoding (every ``configs/pe/*.yaml``, or a subset) and length ``L``:

* **train**: one optimizer step of the training loop — forward, label-smoothed cross-entropy
  (:func:`posenc.training.losses.summed_losses`), backward, gradient clipping and AdamW
  (:func:`posenc.training.optim.make_optimizer`), with the settings of
  ``configs/trainer/default.yaml``,
  dropout as in the model config (training mode), on ``tokens // L`` pairs of ``L`` source and
  ``L`` target tokens (no padding);
* **decode**: :meth:`Seq2Seq.generate` (encoder pass + key/value-cached greedy decoding) of a
  batch of ``decode_batch`` sources of ``L`` tokens, producing exactly ``L`` tokens per row.

Fairness on a noisy machine (timings vary about ±15% from run to run):

* every encoding gets the same model config, seed, and the same random batches at a length;
* decoding never stops early: EOS is set to an id the model cannot produce (``-1``) for the
  call, so every encoding runs exactly ``L`` decoder steps (checked during warm-up), whatever
  its untrained model predicts;
* encodings are interleaved: each repetition measures every encoding once, in an order rotated
  by one each repetition, so slow drifts of the machine's load hit all of them alike; with
  ``--peers`` the peers' slots join the same rotation;
* each (encoding, length) is warmed up before timing (allocations, AdamW state, caches);
* garbage collection runs before, and is disabled during, each timed call;
* reports give medians over repetitions, the ratio of medians to the reference encoding's
  (always measured), the median of per-repetition ratios (paired, more robust to drift), and
  the verdict on each encoding class's own target (:attr:`StackEncoding.speed_target`).

Timing runs with glibc keeping freed memory on its heap, as training does
(:func:`posenc.runtime.device.keep_freed_memory`). Memory (Linux only, after the timing so that
it cannot disturb it): glibc is then told to give back what its heap kept and to serve every
allocation above 64 KiB with its own mapping, returned to the OS when freed; after one settling
step per encoding, the resident set tracks live tensors, and the peak resident set during one
training step (``/proc/self/clear_refs`` resets it) minus the resident set before it is the
step's extra memory (activations, gradients, temporaries) above the model and optimizer state.
"""
