"""Where the local mix (``data=local``) comes from: every raw original at its pinned public URL
with its SHA-256 and size, and every file of the mix with the recipe that makes it from them
and its own SHA-256. :mod:`posenc.data.fetch` downloads, checks and cleans by this manifest;
the recipes are :mod:`posenc.data.cleaning`'s. Measured on 2026-11-28: the files the recipes
make from these originals equal the curated copies the study used, byte for byte.

The originals are files of public GitHub repositories at fixed commits, so their URLs are
``https://raw.githubusercontent.com/OWNER/REPO/COMMIT/PATH`` (a mirror serving the same paths
can replace the host).
"""

from __future__ import annotations

from dataclasses import dataclass

GITHUB_RAW = "https://raw.githubusercontent.com/"
"""The host of every original; ``POSENC_DATA_MIRROR`` replaces it."""


@dataclass(frozen=True)
class Original:
    """A raw original: its path under the host (``OWNER/REPO/COMMIT/PATH``), SHA-256 and size."""

    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Product:
    """A file of the local mix: its path in the data folder, the recipe that makes it (a name of
    :data:`posenc.data.cleaning.RECIPES`) from ``sources`` (paths of originals, or of products
    made before it), and its SHA-256 and size."""

    path: str
    recipe: str
    sources: tuple[str, ...]
    sha256: str
    size: int


_JIANT = "nyu-mll/jiant/ad60d996ed865e59969ca71fe156d4a728e0a0ab/test-full/"
_OPUS = "Helsinki-NLP/OPUS-MT-testsets/ac0f19c0be3cb4e0d9450fcb2d7a9847c4bdd180/testsets/fr-en/"
_GAINS = "shreya-03/GAINS-AI-Project/6deb2f7e08677032e7a8b681dfc805840ccab8ff/"
_FIESTA = "devonzuegel/fiesta/d5896908f2bc92c4d76b09491bcac18e574aef4a/fr-en/train/"
_NC = (
    "dbmikus/11-731.phrase-matrix-aligner/973fa615128f95bba30cf83c7b3bfed66eb5d5df/corpus/training/"
)
_TATOEBA = "modelexlab/data/adddaf33ac35572bcfeb421efec29435e7ea9332/fra-eng.zip"
_VOCAB = (
    "microsoft/BlingFire/18e9a19e586095fb60d629fa850fb610d5bca605/ldbsrc/bert_multi_cased/vocab.txt"
)

ORIGINALS: tuple[Original, ...] = (
    Original(
        _JIANT + "newstest2014-fren-src.fr.sgm",
        "31f98dd65e89ee6d7c3de9b72709a7e4d3f28171e8c2a81802e11cf6b36f25ed",
        512462,
    ),
    Original(
        _JIANT + "newstest2014-fren-ref.en.sgm",
        "c73727c954e92396eb3eed1b2730804a77130c1c3a8bc6a3f5646766fc92a8eb",
        443970,
    ),
    Original(
        _JIANT + "newstest2014-fren-src.en.sgm",
        "5521ed9b1d07763c7e8d7ddfc0fda269cd114612a6283bd3836979ea4dd10a26",
        441845,
    ),
    Original(
        _JIANT + "newstest2014-fren-ref.fr.sgm",
        "c57025c8a338c642fe3ad0206ddc75d258a5584e1d470b75f37af2fb666d7e93",
        514587,
    ),
    Original(
        _OPUS + "newstest2013.fr",
        "909b63be5df3eb8c13e1d5967bf3f0adfdb9f6ed5e638c5bffff563ee2ff7f41",
        393465,
    ),
    Original(
        _OPUS + "newstest2013.en",
        "ace268a1d9724ca76f6d8e5c720ffdc08f01bdce45630ed8b269dc7918e1c16e",
        332974,
    ),
    Original(
        _OPUS + "news-test2008.fr",
        "e212f59bb002d73a1bfebdcf101a6c51db3ccfd8a3115cc8a18414b6ee2a28f9",
        301220,
    ),
    Original(
        _OPUS + "news-test2008.en",
        "134e1140848bb0d05e774dbe35b8b69602faf401250c03dbb437bdbe38c37b6f",
        263240,
    ),
    Original(
        _OPUS + "newssyscomb2009.fr",
        "bf74d7a28aa72aa79cbff02bec00a14983f65616dd37ee53e17a37e9d933505e",
        70529,
    ),
    Original(
        _OPUS + "newssyscomb2009.en",
        "b734a44294fa3b23a2491cd9a2c59fb5eb71332ace70b2c9039978863dd0e43d",
        62557,
    ),
    Original(
        _OPUS + "newstest2009.fr",
        "2f4f17f73c3b927a3a0ba4cc082f22f70dd396d7d71cd14e160940207f5f6958",
        391108,
    ),
    Original(
        _OPUS + "newstest2009.en",
        "3fc92718e7b994ca0a5dc57e63b68d5c80244a56e5bb1cec11d2e8dd10b3ff3c",
        345562,
    ),
    Original(
        _OPUS + "newstest2010.fr",
        "131ee7deb0ea517bdd6a85ca5f6f5ca3136c5f76daba426ef4dde3d60b9e66a9",
        383398,
    ),
    Original(
        _OPUS + "newstest2010.en",
        "1ebece77e333965cbc66fde735a6f17e026b4d6690f4f7fdaba839b7bdadac3b",
        328648,
    ),
    Original(
        _OPUS + "newstest2011.fr",
        "9631ea545acf4b921add6baba856b03efae9f0de4c330a314091b3f925506c7f",
        456618,
    ),
    Original(
        _OPUS + "newstest2011.en",
        "d387569743c0fa9097df4d4e2c1dd9e6ba9ef3cee6e0f473da3204c887dcf8fd",
        396884,
    ),
    Original(
        _OPUS + "newstest2012.fr",
        "29aa5aff172127f6adf5625cc2f8e44f579d524700e84f1ec0eb14f4f19719e4",
        440985,
    ),
    Original(
        _OPUS + "newstest2012.en",
        "f9e51f85c4948033fc7d77ef427f4d88908a8dd3f778970f62d0baafac3ff97e",
        381734,
    ),
    Original(
        _TATOEBA,
        "161c93f18da3a7e6df611ed961426613260de8af06ccf8c79c977afe5135ac44",
        3424571,
    ),
    Original(
        _VOCAB,
        "fe0fda7c425b48c516fc8f160d594c8022a0808447475c1a7c6d6479763f310c",
        995526,
    ),
    Original(
        _GAINS + "europarl-v7.fr-en.fr",
        "7694522a741ffb9203fb5c7b74123f67c8e673a7ffbd1577181595d0b45de259",
        520093,
    ),
    Original(
        _GAINS + "europarl-v7.fr-en.en",
        "1a5ca198b1cbeb88b84ae5856a2d67c642710a419ff0eb1d3f57df81fb0c13bd",
        461576,
    ),
    Original(
        _FIESTA + "europarl-v7.fr-en.fr",
        "ec0aea5328d3fb5debde79eef0317383332d565c77eb53f0d7709b43066a6ae5",
        2254640,
    ),
    Original(
        _FIESTA + "europarl-v7.fr-en.en",
        "06c649ca5db54fafeb19101764ca879be5201ccaba3b0daa19508cc9b18e5a7a",
        1978066,
    ),
    Original(
        _NC + "news-commentary-v8.fr-en.fr",
        "1e81f9af52fea520be9d177e403d427bc3797c09f396ff903079da2000788f74",
        891343,
    ),
    Original(
        _NC + "news-commentary-v8.fr-en.en",
        "5656469397730e4be4626ad1ddcd49d9ec037727fb496ea27e9ba463462e81b0",
        725357,
    ),
)

_W14, _OLD = "wmt14-fr-en/", "wmt14-fr-en/older-newstests/"
_TEST_FR = (_W14 + "newstest2013.fr", _W14 + "newstest2014.fr")
"""The French test sides whose lines the training stems must not contain."""


def _older(name: str, fr: tuple[str, int], en: tuple[str, int]) -> tuple[Product, ...]:
    """An older newstest's two sides: the original's lines, whitespace normalized."""
    return tuple(
        Product(f"{_OLD}{name}.{lang}", "lines", (f"{_OPUS}{name}.{lang}",), sha, size)
        for lang, (sha, size) in (("fr", fr), ("en", en))
    )


def _copy(path: str, original: str) -> Product:
    """A file of the mix that is its original unchanged."""
    found = next(o for o in ORIGINALS if o.path == original)
    return Product(path, "copy", (original,), found.sha256, found.size)


PRODUCTS: tuple[Product, ...] = (
    *(
        _copy(f"{_W14}sgm/{o.path.rsplit('/', 1)[1]}", o.path)
        for o in ORIGINALS
        if o.path.endswith(".sgm")
    ),
    _copy("vocab/bert-base-multilingual-cased-vocab.txt", _VOCAB),
    Product(
        _W14 + "newstest2014.fr",
        "sgm_segments",
        (_JIANT + "newstest2014-fren-src.fr.sgm",),
        "9ed99a750c7818b7bbc62230ed0b1a1673325989bdcf9f81a7d7e67bde8ca473",
        444240,
    ),
    Product(
        _W14 + "newstest2014.en",
        "sgm_segments",
        (_JIANT + "newstest2014-fren-ref.en.sgm",),
        "9a12cb6e8efb3509ebede627e4a9c83ee64935509d561ff70f4b7bd5f93f6096",
        375106,
    ),
    Product(
        _W14 + "newstest2013.fr",
        "lines",
        (_OPUS + "newstest2013.fr",),
        "d197faafd03242c13f4589cc4c8391a8d33da7be08feab5b8759593ee04fda2e",
        393335,
    ),
    Product(
        _W14 + "newstest2013.en",
        "lines",
        (_OPUS + "newstest2013.en",),
        "80b81d23ddfd16724aa21b288b21f29c825c8838807aecbc65fe8a1b313325de",
        332972,
    ),
    *_older(
        "news-test2008",
        ("4b1341ff21cf3d8c3066c6fc28e59d1b1b32bf43cc9bcb85a08c4e4b287f5659", 301219),
        ("8d59671da8f5f9de57e23815667b63cc12f2214ffe19c5b83468f0d9dcae3f0b", 263237),
    ),
    *_older(
        "newssyscomb2009",
        ("bf74d7a28aa72aa79cbff02bec00a14983f65616dd37ee53e17a37e9d933505e", 70529),
        ("b734a44294fa3b23a2491cd9a2c59fb5eb71332ace70b2c9039978863dd0e43d", 62557),
    ),
    *_older(
        "newstest2009",
        ("48ab581bb342a32399d11c0dfdd3550ea7aea513fcc72ce57f142c6b75c4236a", 390940),
        ("c74a4862decfe87f88fb10eacdcb6ac972a648f0dd6deeb25ac2dbc6128dc0b6", 345555),
    ),
    *_older(
        "newstest2010",
        ("131ee7deb0ea517bdd6a85ca5f6f5ca3136c5f76daba426ef4dde3d60b9e66a9", 383398),
        ("1ebece77e333965cbc66fde735a6f17e026b4d6690f4f7fdaba839b7bdadac3b", 328648),
    ),
    *_older(
        "newstest2011",
        ("9631ea545acf4b921add6baba856b03efae9f0de4c330a314091b3f925506c7f", 456618),
        ("d387569743c0fa9097df4d4e2c1dd9e6ba9ef3cee6e0f473da3204c887dcf8fd", 396884),
    ),
    *_older(
        "newstest2012",
        ("e4efc61d0afe4f8b6d5fb14c8f7c161b82b0bb2daa952bcb87c893535e9e4db1", 440978),
        ("4ad37ce6758a083d4c73801896bc74350ae3d9b3cd68d086f6f5790d37e4c164", 381729),
    ),
    Product(
        "tatoeba-fr-en/train.fr",
        "tatoeba_fr",
        (_TATOEBA,),
        "95a02ffa226d452748c660d9440370a22ed8b7c1cf1dae2785fe07af7f94a01a",
        6372002,
    ),
    Product(
        "tatoeba-fr-en/train.en",
        "tatoeba_en",
        (_TATOEBA,),
        "2596f5be2c9b5a097d05802c7a44fae6ef28c5cbfb83cf1d929707ff5b9c74da",
        5273520,
    ),
    Product(
        _W14 + "train/europarl-v7-first3000.fr",
        "pairs_fr",
        (_GAINS + "europarl-v7.fr-en.fr", _GAINS + "europarl-v7.fr-en.en", *_TEST_FR),
        "a584d7c940e4bce64ba13a80a6a6574fff766ecc414c98513593d407d4a209a7",
        519465,
    ),
    Product(
        _W14 + "train/europarl-v7-first3000.en",
        "pairs_en",
        (_GAINS + "europarl-v7.fr-en.fr", _GAINS + "europarl-v7.fr-en.en", *_TEST_FR),
        "17344da14482633537798c5e224acdea179008f044d1dfa0d03012409f6ac9ad",
        460707,
    ),
    Product(
        _W14 + "train/europarl-v7-sample20k.fr",
        "pairs_fr",
        (
            _FIESTA + "europarl-v7.fr-en.fr",
            _FIESTA + "europarl-v7.fr-en.en",
            *_TEST_FR,
            _W14 + "train/europarl-v7-first3000.fr",
            _W14 + "train/europarl-v7-first3000.en",
        ),
        "8683dc4100072193a48cc3b4bc3276c110a95ee2e54af929b1bcf85aed058deb",
        2246337,
    ),
    Product(
        _W14 + "train/europarl-v7-sample20k.en",
        "pairs_en",
        (
            _FIESTA + "europarl-v7.fr-en.fr",
            _FIESTA + "europarl-v7.fr-en.en",
            *_TEST_FR,
            _W14 + "train/europarl-v7-first3000.fr",
            _W14 + "train/europarl-v7-first3000.en",
        ),
        "f114e027c3a77ae52dab942442e685bc4d41a37877679ff200336691d0303a55",
        1973404,
    ),
    Product(
        "wmt13-fr-en/news-commentary-v8-first5000.fr",
        "pairs_fr",
        (_NC + "news-commentary-v8.fr-en.fr", _NC + "news-commentary-v8.fr-en.en", *_TEST_FR),
        "fd85961f42a139ccde803867ea45958ae0726e32a3388bc22fe75242a1f11886",
        890007,
    ),
    Product(
        "wmt13-fr-en/news-commentary-v8-first5000.en",
        "pairs_en",
        (_NC + "news-commentary-v8.fr-en.fr", _NC + "news-commentary-v8.fr-en.en", *_TEST_FR),
        "5dfa63796e30597f3f28f37a6b84ac5b160fbd498151f0e4ceb51e78b370d948",
        724470,
    ),
)
