"""MODEL.PRETRAINED against a stand-in Hub on 127.0.0.1 (HF_ENDPOINT), with the real huggingface_hub and timm:
downloads counted at the server, a cut download retried, one download per node under torchrun, offline with and
without the cache, provenance, the weights' preprocessing, tools/fetch_weights.py."""
from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
import timm
import torch
from huggingface_hub import constants
from safetensors.torch import load_file, save_file

from runner.config import load_config
from runner.errors import UserError
from runner.model import build_model
from runner.weights import hub as weights_hub
from runner.weights.preprocess import resolve, stored_values
from tests.utils import ROOT, assert_user_error, env, run_tool, torchrun
from tests.weights.hub_server import HubServer

REPO, NAME = "timm/test_resnet.r160_in1k", "test_resnet.r160_in1k"
FILE = "model.safetensors"
DIGITS = str(ROOT / "configs" / "digits" / "test_resnet.yaml")
RUN = ["--cfg", DIGITS, "MODEL.NAME", NAME, "MODEL.PRETRAINED", "true", "TRAIN.EPOCHS", "1", "TRAIN.MAX_STEPS", "2",
       "DATA.NUM_WORKERS", "0", "LOG.PROGRESS", "plain", "LOG.TENSORBOARD", "false"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The stand-in Hub serving timm/test_resnet.r160_in1k (random test_resnet weights) and an hf-hub: repo."""
    root = tmp_path_factory.mktemp("hub")
    with HubServer(root / "repos") as server:
        torch.manual_seed(0)
        weights = {k: v.contiguous() for k, v in timm.create_model("test_resnet").state_dict().items()}
        save_file(weights, str(root / FILE))
        server.add(REPO, FILE, (root / FILE).read_bytes())
        config = {"architecture": "test_resnet", "num_classes": 1000,
                  "pretrained_cfg": {"input_size": [3, 160, 160], "interpolation": "bicubic", "crop_pct": 0.9,
                                     "mean": [0.48, 0.46, 0.41], "std": [0.27, 0.26, 0.28], "num_classes": 1000,
                                     "classifier": "fc", "first_conv": "conv1.0"}}
        server.add("someone/tiny-resnet", "config.json", json.dumps(config).encode())
        server.add("someone/tiny-resnet", FILE, (root / FILE).read_bytes())
        yield server


@pytest.fixture
def hub(served, tmp_path, monkeypatch):
    """The server with a fresh cache: HF_ENDPOINT/HF_HOME for child processes, the client's constants here."""
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_ENDPOINT", served.url)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    # what the client read from the environment when it was first imported, as it would read it now
    monkeypatch.setattr(constants, "ENDPOINT", served.url)
    template = served.url + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(weights_hub, "_FETCHED", {})
    monkeypatch.setattr(weights_hub, "BACKOFF_S", 0.0)
    served.requests.clear()
    served.cuts.clear()
    served.home = home
    return served


def served_sha(hub: HubServer, repo: str = REPO) -> str:
    """sha256 of the served weights file."""
    return hashlib.sha256((hub.root / repo / FILE).read_bytes()).hexdigest()


def cfg_of(*pairs: str):
    """A frozen config of the digits recipe with the pretrained test model and KEY VALUE pairs."""
    return load_config([*RUN, *pairs], check_paths=False)[0]


# ---- in-process: the fetch, the fine-tune's tensors, the retries ------------------------------------------------
def test_fine_tune_loads_every_tensor_but_a_resized_head(hub):
    served = load_file(str(hub.root / REPO / FILE))
    model = build_model(cfg_of())  # digits: 10 classes against the weights' 1000
    own = model.state_dict()
    differ = sorted(k for k, v in served.items() if own[k].shape != v.shape or not torch.equal(own[k], v))
    assert differ == ["fc.bias", "fc.weight"] and own["fc.weight"].shape == (10, served["fc.weight"].shape[1])
    assert hub.downloads(REPO, FILE) == 1
    full = build_model(cfg_of("MODEL.NUM_CLASSES", "1000"))  # the weights' own head: every tensor as served
    assert all(torch.equal(full.state_dict()[k], v) for k, v in served.items())
    assert hub.downloads(REPO, FILE) == 1  # fetched once per process


def test_a_cut_download_is_resumed_and_never_read_half(hub):
    hub.cut(REPO, FILE, after=100_000)
    found = weights_hub.fetch(NAME)
    assert found.sha256 == served_sha(hub) == hashlib.sha256(Path(found.file).read_bytes()).hexdigest()
    gets = [p for p in hub.gets() if p.endswith(FILE)]
    assert len(gets) == 2 and hub.downloads(REPO, FILE) == 1  # the cut one, then the one that finished
    assert found.revision == hub.commit(REPO) and found.repo == REPO
    assert found.size == len(Path(found.file).read_bytes())


def test_a_download_that_keeps_breaking_fails_in_one_line_and_leaves_no_file(hub):
    hub.cut(REPO, FILE, after=0, count=1000)  # every GET of the file: headers, then the connection drops
    with pytest.raises(UserError, match=rf"downloading {REPO} {FILE} from .* failed 3 times"):
        weights_hub.fetch(NAME)
    assert not list(hub.home.rglob(FILE))  # no snapshot file a later run could take for the weights
    hub.cuts.clear()
    found = weights_hub.fetch(NAME)  # the next try downloads it whole
    assert found.sha256 == served_sha(hub)


def test_offline_reads_the_cache_or_says_what_to_fetch(hub, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(UserError) as e:
        weights_hub.fetch(NAME)
    line = str(e.value)
    assert NAME in line and str(hub.home / "hub") in line and "python tools/fetch_weights.py " + NAME in line
    assert not hub.gets()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    weights_hub.fetch(NAME)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(weights_hub, "_FETCHED", {})
    hub.requests.clear()
    model = build_model(cfg_of())
    assert not hub.requests and model.num_classes == 10  # built from the cache, no request at all


def test_hf_hub_names_read_the_repos_config_and_weights(hub):
    cfg = cfg_of("MODEL.NAME", "hf-hub:someone/tiny-resnet", "AUG.INTERPOLATION", "auto")
    model = build_model(cfg)
    served = load_file(str(hub.root / "someone/tiny-resnet" / FILE))
    assert torch.equal(model.state_dict()["conv1.0.weight"], served["conv1.0.weight"])
    resolved = resolve(cfg)
    assert resolved.DATA.MEAN == (0.48, 0.46, 0.41) and resolved.AUG.INTERPOLATION == "bicubic"
    assert resolved.EVAL.CROP_PCT == 0.9
    with pytest.raises(UserError, match="the Hub has no repo someone/missing"):
        weights_hub.fetch("hf-hub:someone/missing")


def test_names_without_weights_are_one_line(hub):
    with pytest.raises(UserError, match="'resnt18' is not a timm model; did you mean"):
        weights_hub.fetch("resnt18")
    with pytest.raises(UserError, match="timm has no pretrained weights for MODEL.NAME resnet50_mlp.untrained"):
        weights_hub.fetch("resnet50_mlp.untrained")


# ---- preprocessing that follows the weights ------------------------------------------------------------------
def test_auto_preprocessing_follows_the_weights_and_a_stored_run(caplog):
    plain = resolve(load_config(["--cfg", DIGITS], check_paths=False)[0])
    assert plain.DATA.MEAN == (0.485, 0.456, 0.406) and plain.AUG.INTERPOLATION == "bilinear"
    assert plain.EVAL.CROP_PCT == 0.0  # = AUG.CROP_PCT, as before
    weights = resolve(cfg_of())  # timm's pretrained_cfg: no download needed to know it
    assert weights.DATA.MEAN == (0.5, 0.5, 0.5) and weights.DATA.STD == (0.5, 0.5, 0.5)
    assert weights.EVAL.CROP_PCT == 0.95 and weights.is_frozen()
    grey = resolve(cfg_of("MODEL.IN_CHANS", "1"))
    assert grey.DATA.MEAN == (0.5,) and grey.DATA.STD == (0.5,)
    stored = resolve(cfg_of(), stored={"DATA.MEAN": (0.1, 0.2, 0.3)})  # a resume keeps what the run took
    assert stored.DATA.MEAN == (0.1, 0.2, 0.3) and stored.DATA.STD == (0.5, 0.5, 0.5)
    with caplog.at_level("WARNING", logger="runner"):
        resolve(cfg_of("DATA.MEAN", "[0.485, 0.456, 0.406]"), warn=True)
    assert [r.getMessage() for r in caplog.records if "differs from what" in r.getMessage()] == [
        "preprocessing differs from what test_resnet.r160_in1k's pretrained weights were trained with: DATA.MEAN "
        "[0.485, 0.456, 0.406] (the weights': [0.5, 0.5, 0.5]); set those keys to auto to follow the weights"]
    assert stored_values("DATA:\n  MEAN: [0.5, 0.5, 0.5]\nAUG:\n  INTERPOLATION: bicubic\n") == {
        "DATA.MEAN": (0.5, 0.5, 0.5), "AUG.INTERPOLATION": "bicubic"}


# ---- runs: a download, none the second time, offline, provenance, resume ---------------------------------------
@pytest.mark.slow
def test_runs_download_once_record_the_weights_and_keep_their_preprocessing(hub, tmp_path):
    first = run_tool("train.py", [*RUN, "OUTPUT_DIR", str(tmp_path / "a")], env=env())
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stderr == ""
    second = run_tool("train.py", [*RUN, "OUTPUT_DIR", str(tmp_path / "b")], env=env())
    assert second.returncode == 0, second.stderr[-3000:]
    assert hub.downloads(REPO, FILE) == 1 and len([p for p in hub.gets() if p.endswith(FILE)]) == 1
    sha, commit = served_sha(hub), hub.commit(REPO)
    for run in ("a", "b"):
        results = json.loads((tmp_path / run / "results.json").read_text())
        assert results["pretrained"] == {"model": NAME, "repo": REPO, "revision": commit, "sha256": sha,
                                         "size": (hub.root / REPO / FILE).stat().st_size}
        assert f"pretrained: {NAME} = {REPO}@{commit} {FILE} sha256 {sha}" in (tmp_path / run / "env.txt").read_text()
        stored = stored_values((tmp_path / run / "config.yaml").read_text())
        assert stored == {"DATA.MEAN": (0.5, 0.5, 0.5), "DATA.STD": (0.5, 0.5, 0.5), "AUG.INTERPOLATION": "bilinear",
                          "EVAL.CROP_PCT": 0.95}
    # a longer run resumed offline: the cache serves, no request, "auto" keeps the stored values (not refused)
    hub.requests.clear()
    more = run_tool("train.py", [*RUN, "TRAIN.MAX_STEPS", "4", "TRAIN.EXTEND", "true", "OUTPUT_DIR",
                                 str(tmp_path / "a")], env=env(HF_HUB_OFFLINE="1"))
    assert more.returncode == 0, more.stderr[-3000:]
    assert not hub.requests and json.loads((tmp_path / "a" / "results.json").read_text())["step"] == 4


@pytest.mark.slow
def test_offline_without_the_weights_is_one_line_before_any_folder(hub, tmp_path):
    proc = run_tool("train.py", [*RUN, "OUTPUT_DIR", str(tmp_path / "run")], env=env(HF_HUB_OFFLINE="1"))
    assert_user_error(proc, NAME, str(hub.home / "hub"), "python tools/fetch_weights.py")
    assert not (tmp_path / "run").exists() and not hub.requests


@pytest.mark.slow
def test_fetch_weights_fills_the_cache_for_offline_runs(hub, tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"cfg: [{DIGITS}]\nset: {{MODEL.PRETRAINED: true}}\nroot: {tmp_path / 'sweep'}\n"
                     f"grid: {{MODEL.NAME: [{NAME}, hf-hub:someone/tiny-resnet]}}\n")
    proc = run_tool("fetch_weights.py", [str(sweep), NAME], env=env())
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"{NAME}: {REPO}@{hub.commit(REPO)[:12]} {FILE} 1.8 MiB -> {hub.home / 'hub'}")
    assert lines[1].startswith("hf-hub:someone/tiny-resnet: someone/tiny-resnet@")
    assert lines[2].startswith("2 model(s), 3.6 MiB, in ") and hub.downloads(REPO, FILE) == 1
    hub.requests.clear()
    run = run_tool("train.py", [*RUN, "OUTPUT_DIR", str(tmp_path / "run")], env=env(HF_HUB_OFFLINE="1"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert not hub.requests
    assert_user_error(run_tool("fetch_weights.py", [DIGITS], env=env()), "nothing to fetch")


@pytest.mark.slow
def test_one_download_per_node_under_torchrun(hub, tmp_path):
    log = tmp_path / "log.txt"
    args = ["--standalone", "--nproc_per_node=2", str(ROOT / "tools" / "train.py"), *RUN,
            "OUTPUT_DIR", str(tmp_path / "run")]
    with open(log, "w") as f:
        proc = subprocess.run(torchrun(args), stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env(), timeout=300)
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert hub.downloads(REPO, FILE) == 1  # local rank 1 waited, then read the cache
    assert len([p for p in hub.gets() if p.endswith(FILE)]) == 1
    assert json.loads((tmp_path / "run" / "results.json").read_text())["pretrained"]["sha256"] == served_sha(hub)
