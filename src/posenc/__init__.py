"""posenc: encoder-decoder Transformers trained with many positional encodings, compared.

Packages follow the data flow of a run, and a module imports only from its own phase or an
earlier one: ``config`` -> ``runtime`` -> ``data`` -> ``model`` -> ``training`` ->
``evaluation`` -> ``analysis``; ``job`` (one Hydra job) ties training and evaluation together.
"""
