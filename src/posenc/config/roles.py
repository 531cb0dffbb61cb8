"""What each setting is to a run besides a hyper-parameter, declared once per key: whether it only
steers how or where the run executes, bounds how long it trains, names a file, is left out of
reports or of the run directory's name. Every list of keys that identity, the report, the run
directory's name, a standalone evaluation's name and Hydra's ``exclude_keys`` use is derived
from :data:`ROLES` (``configs/train.yaml`` reads the last through the resolver
``${nameless_keys:}``); a setting with no entry is a hyper-parameter: part of the run's
identity, its name and its reports."""

from __future__ import annotations

from enum import Flag, auto

from omegaconf import OmegaConf


class Role(Flag):
    """A setting's roles (several may hold)."""

    #: changes how or where a run executes, never what it computes: runs that differ only in
    #: these are the same system (the seed is one, though it is part of a run's identity)
    RUN_CONTROL = auto()
    #: bounds how long a run trains: raising one continues the same run in the same directory
    BUDGET = auto()
    #: names a file or directory: part of a run's identity as the real path it names
    FILE = auto()
    #: left out of the model's identity that a checkpoint is checked against (the file it
    #: names is checked by its content)
    NOT_MODEL = auto()
    #: left out of reports: where a machine keeps its files
    UNREPORTED = auto()
    #: left out of the run directory's readable name (Hydra's ``exclude_keys``)
    NAMELESS = auto()
    #: changes how an evaluation runs, never what it reports: left out of its identity and of a
    #: standalone evaluation's folder name
    EVAL_CONTROL = auto()
    #: scores or selects the test splits: translating a text, which reads its own input, has no
    #: use for it (``posenc.translate`` leaves it out of its help)
    SCORING = auto()


R, B, F, M, U, N, E, S = (
    Role.RUN_CONTROL,
    Role.BUDGET,
    Role.FILE,
    Role.NOT_MODEL,
    Role.UNREPORTED,
    Role.NAMELESS,
    Role.EVAL_CONTROL,
    Role.SCORING,
)

#: every setting that is more than a hyper-parameter, with its roles
ROLES: dict[str, Role] = {
    "seed": R,
    "name": R | N,
    "experiment": N,  # Hydra's group choice: its settings are in the name's other keys
    "cache_dir": R | U | N,
    "device": R | N | E,
    "threads": R | N | E,
    "objective": R | N,
    "reference_pe": R | N,
    "data.dir": F | U | N,
    "tokenizer.vocab_file": F | M | U | N,
    "trainer.max_steps": B | N,
    "trainer.max_time": B | N,
    "trainer.patience": B,
    "trainer.init_from": F | N,
    "trainer.resume": R | N,
    "trainer.progress": R | N | E,
    "trainer.log_every": R,
    "trainer.compile": R,
    "trainer.nan_policy": R,
    "trainer.nan_skip_limit": R,
    "eval.splits": R | N | S,
    "eval.enabled": E | S,
    "eval.bertscore.model": N | S,
    "eval.bertscore.layer": S,
    "eval.bertscore.batch_size": E | S,
    "eval.comet.model": N | S,
    "eval.comet.batch_size": E | S,
    "eval.max_sentences": N | S,
    "eval.length_buckets": S,
    "eval.pe_variants": S,
    "logger.csv": R | N,
    "logger.mlflow": R | N,
    "logger.mlflow_uri": R | U | N,
    "logger.wandb": R | N,
    "logger.wandb_mode": R | N,
    "logger.wandb_project": R | N,
}


def keys_with(role: Role) -> frozenset[str]:
    """The settings that have ``role``."""
    return frozenset(key for key, roles in ROLES.items() if role in roles)


OmegaConf.register_new_resolver(
    "nameless_keys", lambda: sorted(keys_with(Role.NAMELESS)), replace=True
)
