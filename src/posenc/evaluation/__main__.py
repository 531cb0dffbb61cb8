"""``python -m posenc.evaluation run_dir=PATH [KEY=VALUE ...]``: see :mod:`.standalone`."""

from posenc.evaluation.standalone import main

main()
