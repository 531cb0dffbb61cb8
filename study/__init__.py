"""The study reported in docs/, beside the harness and not in its wheel: analyses across sweeps
(the headline, depth contrasts, length-bucket contrasts, the extrapolation penalty, the alignment
probe) and the guide's generated sections. It imports posenc; posenc never imports it. Its
commands: ``python -m study COMMAND [ARGS]`` (:mod:`study.__main__`)."""
