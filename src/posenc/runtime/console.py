"""A sweep's console: each job's lines start with its run's name, so the lines of jobs that run
side by side (``hydra/launcher=parallel``) can be told apart; the run's own ``train.log`` keeps
its lines as they are."""

from __future__ import annotations

import logging

#: the attribute under which a console handler keeps its formatter from before any label
_UNLABELLED = "_posenc_unlabelled_formatter"


def label_console(label: str | None) -> None:
    """Prefix every line the root logger's console handlers write with ``label | `` (None: no
    prefix); called again, the new label replaces the old one. File handlers are left alone."""
    for handler in logging.getLogger().handlers:
        if type(handler) is not logging.StreamHandler:  # FileHandler and kin: the run's log
            continue
        if not hasattr(handler, _UNLABELLED):
            setattr(handler, _UNLABELLED, handler.formatter or logging.Formatter())
        base: logging.Formatter = getattr(handler, _UNLABELLED)
        if label is None:
            handler.setFormatter(base)
            continue
        fmt = base._fmt or "%(message)s"
        handler.setFormatter(
            logging.Formatter(fmt.replace("%(message)s", f"{label} | %(message)s"), base.datefmt)
        )
