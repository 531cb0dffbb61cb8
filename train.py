"""Train and evaluate one encoder-decoder Transformer: ``python train.py pe=rope``.

Sweep: ``python train.py -m pe=nonepe,sinpe,rope``. Every setting is in ``configs/``. The
console command ``posenc-train`` is the same (:mod:`posenc.cli`).
"""

from posenc.cli import train

if __name__ == "__main__":
    train()
