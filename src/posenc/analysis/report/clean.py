"""In-domain test sets on their clean part. Runs made before ``data.holdout_drops`` trained on
pairs that share a target with their held-out sets (504 of the 1,000 Tatoeba references of the
local mix); for each held-out split where a run's data leaks so, the report adds the split
``NAME-clean``: the pairs that share neither side with the run's training pairs, every run
scored again there from the hypotheses it wrote (no retraining, no decoding); a run held out
under the rule enters ``NAME-clean`` with the whole split, so sweeps of both kinds can be read
on one clean split. Its files are written under the report's ``clean/`` folder, one per run."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posenc.analysis.report.runs import Entry, Group, split_entries
from posenc.analysis.report.stats import read_lines
from posenc.data.corpus import DataError
from posenc.data.splits import shared_with_training
from posenc.evaluation.metrics import corpus_scores
from posenc.runtime.files import write_text

log = logging.getLogger("posenc.analysis.report")

SUFFIX = "-clean"


def clean_entries(
    groups: Sequence[Group], splits: Sequence[str], out: Path
) -> dict[str, dict[str, list[Entry]]]:
    """``{NAME-clean: {system: entries}}`` for each held-out split of ``splits``: every run
    scored on the pairs that share no side with its training pairs, which for a run whose
    held-out set shares none is its own entry, whole (runs whose data cannot be read are left
    out, with a warning)."""
    shared_by_data: dict[str, dict[str, list[bool]] | None] = {}
    found: dict[str, dict[str, list[Entry]]] = {}
    for split in splits:
        for system, entries in split_entries(groups, split).items():
            for entry in entries:
                shared = _shared(entry.run.config, split, shared_by_data)
                if shared and not any(shared):  # held out under the rule: all of it is clean
                    found.setdefault(split + SUFFIX, {}).setdefault(system, []).append(entry)
                    continue
                hyps, refs = read_lines(entry.hypotheses), read_lines(entry.references)
                if not shared or not hyps or not refs:
                    continue
                if len(hyps) != len(refs) or len(hyps) > len(shared):
                    continue
                keep = [i for i in range(len(hyps)) if not shared[i]]
                folder = out / "clean" / entry.run.name
                folder.mkdir(parents=True, exist_ok=True)
                name = split + SUFFIX
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
    config: dict[str, Any], split: str, cache: dict[str, dict[str, list[bool]] | None]
) -> list[bool] | None:
    """Whether each pair of held-out ``split`` shares a side with the training pairs of the
    run whose flattened ``config`` this is; None when ``split`` is not one of its held-out
    sets or its data cannot be read."""
    data = _data_node(config)
    if data.get("kind") != "local" or split not in (data.get("holdout") or {}):
        return None
    key = json.dumps(data, sort_keys=True, default=str)
    if key not in cache:
        try:
            cache[key] = shared_with_training(data)
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
