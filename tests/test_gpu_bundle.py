"""The GPU bundle: the wheels and data that travel to the GPU machine, and the one
command run there (``scripts/gpu/run.sh``), checked on the CPU. Nothing here needs the network:
the tests of a built bundle skip when ``gpu_bundle/`` has not been built
(``bash scripts/gpu/build_bundle.sh``)."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename

ROOT = Path(__file__).resolve().parents[1]


def _load_bundle():
    spec = importlib.util.spec_from_file_location("gpu_bundle", ROOT / "scripts/gpu/bundle.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bundle = _load_bundle()
IMAGE = bundle.image_packages()
CARRIED = set(bundle.PACKAGES)
WHEELS = bundle.BUNDLE / "wheels"
built = pytest.mark.skipif(
    not WHEELS.is_dir(), reason="gpu_bundle/ is not built (bash scripts/gpu/build_bundle.sh)"
)
REQUIRES = "Requires-Dist:"
#: the GPU machine's interpreter, for markers and wheel tags
GPU_PYTHON = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3"}


def needs(requirements: list[str] | None) -> set[str]:
    """The normalised names a package requires on the GPU's Python 3.12, extras left out."""
    names = set()
    for text in requirements or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({**GPU_PYTHON, "extra": ""}):
            names.add(bundle.normalise(req.name))
    return names


def pyproject_needs() -> set[str]:
    """posenc's dependencies and those of the extras the GPU runs use."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    return needs(project["dependencies"] + [r for e in bundle.EXTRAS for r in extras[e]])


def test_every_dependency_the_image_lacks_is_carried_or_left_behind_with_a_reason():
    missing = pyproject_needs() - IMAGE
    assert {"hydra-core", "omegaconf", "datasets", "bert-score"} <= missing
    assert missing <= CARRIED | set(bundle.NOT_CARRIED), missing - CARRIED
    assert not (CARRIED | set(bundle.NOT_CARRIED)) & IMAGE  # nothing the image has (torch...)
    assert not CARRIED & set(bundle.NOT_CARRIED)
    assert "torch" in IMAGE and all(why for _, why in bundle.PACKAGES.values())


def test_the_carried_packages_are_closed_under_their_requirements_and_all_needed():
    """From the packages' metadata as installed here (the built wheels' own: below)."""
    wanted = pyproject_needs() - IMAGE
    for name in bundle.PACKAGES:
        required = needs(md.requires(name))
        assert required <= IMAGE | CARRIED, f"{name} needs {required - IMAGE - CARRIED}"
        wanted |= required - IMAGE
    assert wanted - set(bundle.NOT_CARRIED) == CARRIED


def test_the_data_files_cover_the_default_local_mix_and_the_mbert_vocabulary():
    files = bundle.data_files()
    assert "vocab/bert-base-multilingual-cased-vocab.txt" in files
    for stem in ("wmt14-fr-en/newstest2014", "wmt14-fr-en/newstest2013", "tatoeba-fr-en/train"):
        assert {f"{stem}.fr", f"{stem}.en"} <= set(files)
    assert len(files) == len(set(files))


@built
def test_the_built_bundle_has_one_wheel_per_package_for_cpython_312_on_x86_64():
    assert bundle.check_wheels(WHEELS) == []
    tags = set(cpython_tags((3, 12), platforms=bundle.PLATFORMS))
    tags |= set(compatible_tags((3, 12), "cp312", bundle.PLATFORMS))
    for path in WHEELS.glob("*.whl"):
        assert parse_wheel_filename(path.name)[3] & tags, f"{path.name} does not install on 3.12"
        with zipfile.ZipFile(path) as wheel:
            meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
            lines = wheel.read(meta).decode().splitlines()
        required = needs([line.split(":", 1)[1] for line in lines if line.startswith(REQUIRES)])
        assert required <= IMAGE | CARRIED, f"{path.name} needs {required - IMAGE - CARRIED}"


@built
def test_the_built_bundle_holds_the_data_and_fits_the_carry_limit():
    data = bundle.BUNDLE / "data"
    for name in bundle.data_files():
        assert (data / name).is_file() or (data / f"{name}.gz").is_file(), name
    size = bundle.size(bundle.BUNDLE)
    tree = bundle.travelling_tree() or 0
    assert size + tree <= bundle.TRAVEL_LIMIT, f"{size + tree} bytes would travel"


def hidden_here() -> set[str]:
    """The packages installed here that the image neither holds nor needs (as installed here):
    on the GPU machine they would be absent."""
    dists = [d for d in md.distributions() if d.metadata["Name"]]
    installed = {bundle.normalise(d.metadata["Name"]): d for d in dists}
    todo = [name for name in IMAGE if name in installed]
    supplied = set(todo)
    while todo:
        for name in needs(installed[todo.pop()].requires) & set(installed) - supplied:
            supplied.add(name)
            todo.append(name)
    return set(installed) - supplied


#: run in a subprocess: the packages in argv[3] (hidden_here) are looked for only in the folder
#: the wheels were installed into (argv[1]) and src/ (posenc)
SANDBOX = """
import importlib.machinery, importlib.metadata as md, re, sys
allowed, hidden, configs = sys.argv[1:3], set(sys.argv[3].split(",")), sys.argv[4]
del sys.argv[1:]  # posenc's command-line modules read it
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
blocked = {top for top, dists in md.packages_distributions().items()
           if all(norm(d) in hidden for d in dists)}

class OnlyTheBundle(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if "." not in name and name in blocked:
            path = allowed
        return importlib.machinery.PathFinder.find_spec(name, path, target)

sys.meta_path[:] = [OnlyTheBundle if f is importlib.machinery.PathFinder else f
                    for f in sys.meta_path]
sys.path[:0] = allowed
import pkgutil, posenc
for info in pkgutil.walk_packages(posenc.__path__, "posenc."):
    if not info.name.endswith("__main__"):
        importlib.import_module(info.name)
import bert_score, datasets
import hydra_plugins.hydra_joblib_launcher, hydra_plugins.hydra_submitit_launcher
from hydra import compose, initialize_config_dir
with initialize_config_dir(configs, version_base="1.3"):
    cfg = compose("train", ["experiment=seed_report", "hydra/launcher=parallel"],
                  return_hydra_config=True)
assert cfg.hydra.launcher._target_.endswith("JoblibLauncher") and cfg.tokenizer.kind == "mbert"
print("imported from", sorted({m.__file__.split("/site-packages")[0] for m in
      (sys.modules["hydra"], sys.modules["datasets"], sys.modules["multiprocess"])}))
"""


@built
def test_posenc_imports_with_only_the_image_packages_and_the_bundles_wheels(tmp_path):
    """The wheel set is complete: installed offline (pip --no-index --no-deps) as run.sh does,
    every posenc module, datasets, bert-score and the launchers import, and the seed report's
    config composes, with every package the image lacks hidden from this environment."""
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    pip += ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"]
    pip += ["--platform", "manylinux2014_x86_64", "--target", str(site)]
    subprocess.run([*pip, *map(str, WHEELS.glob("*.whl"))], check=True, capture_output=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    allowed = [str(site), str(ROOT / "src")]
    hidden = hidden_here()
    assert CARRIED.issubset(hidden)  # posenc too where it is installed: it must come from src/
    done = subprocess.run(
        [sys.executable, "-c", SANDBOX, *allowed, ",".join(sorted(hidden)), str(ROOT / "configs")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"imported from ['{site}" in done.stdout


def run_sh(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "DEVICE": "cpu",
        "PYTHON": sys.executable,
        "OUT": str(tmp_path / "out"),
        "WORK": str(tmp_path / "work"),
        "SITE": str(tmp_path / "site"),
        "POSENC_CACHE": str(tmp_path / "cache"),
    }
    command = ["bash", str(ROOT / "scripts/gpu/run.sh"), *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path)


def test_run_sh_smoke_trains_decodes_and_scores_on_the_cpu(tmp_path):
    done = run_sh(tmp_path, "smoke", "trainer.max_steps=10", "trainer.valid_every=5")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == [
        "env.txt",
        "smoke.log",
        "smoke_metrics.json",
        "smoke_train_summary.json",
    ]
    assert "device=cpu" in (out / "env.txt").read_text()
    metrics = json.loads((out / "smoke_metrics.json").read_text())
    assert metrics["splits"]["test"]["bleu"] >= 0
    assert json.loads((out / "smoke_train_summary.json").read_text())["steps"] == 10
    if WHEELS.is_dir():  # the bundle's packages were installed and put first
        assert (tmp_path / "site" / "hydra").is_dir()


def test_run_sh_names_its_steps_when_given_another():
    done = subprocess.run(["bash", str(ROOT / "scripts/gpu/run.sh"), "train"], capture_output=True)
    assert (
        done.returncode == 2
        and b"test|bench|forms|seed_report|scaling|depth|study|smoke" in done.stderr
    )


@pytest.mark.slow
def test_run_sh_study_runs_the_seed_report_and_the_scaling_check_at_once_on_the_cpu(tmp_path):
    done = run_sh(tmp_path, "study")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = tmp_path / "out"
    for name in ("seed_report", "scaling"):
        assert (out / f"{name}.md").is_file() and (out / f"{name}.log").is_file()
        with tarfile.open(out / f"{name}.tar.gz") as tar:
            evaluated = [n for n in tar.getnames() if n.endswith("/metrics.json")]
            assert not [n for n in tar.getnames() if n.endswith(".pt")]
        assert len(evaluated) == (2 if name == "seed_report" else 3)  # scaling: a variant too
    assert "pe.off_layers=[2]" in "".join(evaluated)


@pytest.mark.slow
def test_run_sh_depth_trains_its_encodings_and_variant_at_once_and_scores_them_on_the_cpu(tmp_path):
    done = run_sh(tmp_path, "depth")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = tmp_path / "out"
    assert (out / "depth.md").is_file() and (out / "depth.log").is_file()
    with tarfile.open(out / "depth.tar.gz") as tar:
        evaluated = [n for n in tar.getnames() if n.endswith("/metrics.json")]
    assert len(evaluated) == 3 and "pe.cross_attention=rotated" in "".join(evaluated)


def test_run_sh_bench_times_and_profiles_on_the_cpu(tmp_path):
    done = run_sh(tmp_path, "bench")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = tmp_path / "out"
    bench = json.loads((out / "bench_tiny.json").read_text())
    assert bench["settings"]["device"] == "cpu" and bench["settings"]["precision"] == "fp32"
    assert "aten::" in (out / "profile.md").read_text()


@pytest.mark.slow  # compiles the tiny model (about 30 s on two cores)
def test_run_sh_forms_times_and_profiles_the_step_forms_on_the_cpu(tmp_path):
    done = run_sh(tmp_path, "forms")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = tmp_path / "out"
    forms = json.loads((out / "step_forms.json").read_text())
    assert [row["label"] for row in forms["rows"]] == [
        "nonepe eager",
        "nonepe compiled",
        "rope eager",
    ]
    assert forms["rows"][0]["of_first"] == 1.0 and forms["flops"] > 0
    report = (out / "step_forms.md").read_text()
    assert "## Profile: nonepe compiled" in report and "aten::" in report
