"""In-domain test sets on their clean and near-clean parts. Runs made before
``data.holdout_drops`` trained on pairs that share a target with their held-out sets (504 of the
1,000 Tatoeba references of the local mix); for each held-out split where a run's data leaks so,
the report adds the split ``NAME-clean``: the pairs that share neither side with the run's
training pairs, every run scored again there from the hypotheses it wrote (no retraining, no
decoding); a run held out under the rule enters ``NAME-clean`` with the whole split, so sweeps of
both kinds can be read on one clean split. ``NAME-nearclean`` (asked for by name) keeps only the
pairs whose source and reference are not within one word of a training sentence either
(:mod:`posenc.data.near_duplicates`): 321 of Tatoeba's 1,000 and 981 of Europarl's in the
local mix. Their files are written under the report's ``clean/`` folder, one per run."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posenc.analysis.report.runs import Entry, Group, split_entries
from posenc.analysis.report.stats import read_lines
from posenc.config.data import data_config
from posenc.data.corpus import DataError
from posenc.data.splits import shared_with_training
from posenc.evaluation.metrics import corpus_scores
from posenc.runtime.files import write_text

log = logging.getLogger("posenc.analysis.report")

SUFFIX = "-clean"  #: no side shared with a training pair
NEAR_SUFFIX = "-nearclean"  #: no side within one word of a training pair's


def entries_by_split(
    groups: Sequence[Group], splits: Sequence[str], out: Path
) -> dict[str, dict[str, list[Entry]]]:
    """``{split: {system: entries}}`` for each of ``splits``: a split's own entries, or a
    held-out set's clean (``NAME-clean``) or near-clean (``NAME-nearclean``) part, scored into
    ``out``."""
    found = {}
    for suffix in (SUFFIX, NEAR_SUFFIX):
        bases = [s.removesuffix(suffix) for s in splits if s.endswith(suffix)]
        found.update(clean_entries(groups, bases, out, suffix))
    return {
        s: found.get(s, {}) if s.endswith((SUFFIX, NEAR_SUFFIX)) else split_entries(groups, s)
        for s in splits
    }


def clean_entries(
    groups: Sequence[Group], splits: Sequence[str], out: Path, suffix: str = SUFFIX
) -> dict[str, dict[str, list[Entry]]]:
    """``{NAME + suffix: {system: entries}}`` for each held-out split of ``splits``: every run
    scored on the pairs that share no side with its training pairs (``suffix``
    :data:`SUFFIX`; for a run whose held-out set shares none, its own entry, whole) or that
    have no side within one word of a training pair's (:data:`NEAR_SUFFIX`). Runs whose data
    cannot be read are left out, with a warning."""
    near = suffix == NEAR_SUFFIX
    shared_by_data: dict[str, dict[str, list[bool]] | None] = {}
    found: dict[str, dict[str, list[Entry]]] = {}
    for split in splits:
        name = split + suffix
        for system, entries in split_entries(groups, split).items():
            for entry in entries:
                shared = _shared(entry.run.config, split, shared_by_data, near)
                if shared and not any(shared):  # nothing to leave out: all of it is clean
                    found.setdefault(name, {}).setdefault(system, []).append(entry)
                    continue
                hyps, refs = read_lines(entry.hypotheses), read_lines(entry.references)
                if not shared or not hyps or not refs:
                    continue
                if len(hyps) != len(refs) or len(hyps) > len(shared):
                    continue
                keep = [i for i in range(len(hyps)) if not shared[i]]
                folder = out / "clean" / entry.run.name
                folder.mkdir(parents=True, exist_ok=True)
                paths = [folder / f"{kind}.{name}.txt" for kind in ("hypotheses", "references")]
                for path, lines in zip(paths, (hyps, refs), strict=True):
                    write_text(path, "".join(lines[i] + "\n" for i in keep))
                scores = corpus_scores([hyps[i] for i in keep], [refs[i] for i in keep])
                scores["sentences"] = len(keep)
                found.setdefault(name, {}).setdefault(system, []).append(
                    Entry(system, entry.run, scores, *paths)
                )
    return found


def _shared(
    config: dict[str, Any],
    split: str,
    cache: dict[str, dict[str, list[bool]] | None],
    near: bool,
) -> list[bool] | None:
    """Whether each pair of held-out ``split`` shares a side with (``near``: has a side within
    one word of) the training pairs of the run whose flattened ``config`` this is; None when
    ``split`` is not one of its held-out sets or its data cannot be read."""
    data = _data_node(config)
    if data.get("kind") != "local" or split not in (data.get("holdout") or {}):
        return None
    key = json.dumps(data, sort_keys=True, default=str)
    if key not in cache:
        try:
            cache[key] = shared_with_training(data_config(data), near)
        except DataError as err:
            log.warning("no clean part of %s: %s", split, err)
            cache[key] = None
    found = cache[key]
    return None if found is None else found.get(split)


def _data_node(config: dict[str, Any]) -> dict[str, Any]:
    """The ``data`` node of a flattened config, nested again."""
    node: dict[str, Any] = {}
    for key, value in config.items():
        if key.startswith("data."):
            *parents, last = key.split(".")[1:]
            place = node
            for part in parents:
                place = place.setdefault(part, {})
            place[last] = value
    return node
