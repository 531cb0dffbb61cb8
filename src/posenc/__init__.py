"""posenc: encoder-decoder Transformers trained with many positional encodings, compared.

Packages follow the data flow of a run, and a module imports only from its own phase or an
earlier one: ``config`` -> ``runtime`` -> ``data`` -> ``model`` -> ``training`` ->
``evaluation`` -> ``analysis``; ``job`` (one Hydra job) ties training and evaluation together.
"""


def __getattr__(name: str):
    """``posenc.load_run`` (:func:`posenc.api.load_run`), imported when first asked for, so
    that ``import posenc`` stays cheap."""
    if name == "load_run":
        from posenc.api import load_run

        return load_run
    raise AttributeError(f"module 'posenc' has no attribute {name!r}")
