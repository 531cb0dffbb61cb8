"""Train and evaluate one encoder-decoder Transformer: ``python train.py pe=rope``.

Sweep: ``python train.py -m pe=nonepe,sinpe,rope``. Every setting is in ``configs/``.
"""

import hydra
from omegaconf import DictConfig

from posenc.job import hydra_job, objective, run


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float | None:
    run_dir, multirun = hydra_job()
    run(cfg, run_dir, multirun)
    return objective(cfg, run_dir)


if __name__ == "__main__":
    main()
