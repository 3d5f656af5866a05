"""Issue 33, item 4: ``onmt_doc_server`` serves an ensemble, several checkpoints as one named model
(``-model NAME=A.pt B.pt``, as ``onmt_doc_translate -model A.pt B.pt``): its answers equal
``Translator.load([A.pt, B.pt])``'s, and GET /models names its checkpoints by file name only."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

pytest.importorskip("flask", reason="the server extra is not installed (pip install -e .[server])")
pytest.importorskip("waitress", reason="the server extra is not installed (pip install -e .[server])")

from test_api import read_documents  # noqa: E402
from test_server import SERVER, Server, one_line_error, post, request  # noqa: E402

from onmt_doc import Translator  # noqa: E402
from onmt_doc.models.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)


@pytest.fixture(scope="module")
def members(trained_run, tmp_path_factory) -> tuple[Path, Path]:
    """Two different checkpoints of one vocabulary: the trained model, and a copy whose weights are
    moved by noise (a second member without a second training run)."""
    first = trained_run / "checkpoints" / "last.pt"
    ckpt = load_checkpoint(str(first))
    generator = torch.Generator().manual_seed(0)
    for name, w in ckpt["model"].items():
        if w.is_floating_point() and w.numel() > 1:
            ckpt["model"][name] = w + 0.5 * w.std() * torch.randn(w.shape, generator=generator)
    second = tmp_path_factory.mktemp("member") / "noisy.pt"
    save_checkpoint(ckpt, str(second))
    return first, second


@pytest.fixture(scope="module")
def docs(toy_dir) -> list[list[str]]:
    return read_documents(toy_dir / "test.src", 12)


@pytest.fixture(scope="module")
def server(members, tmp_path_factory):
    first, second = members
    log = tmp_path_factory.mktemp("server_ensemble") / "server.log"
    srv = Server(["-model", f"ens={first}", str(second), "-model", f"single={first}", "-port", "0"], log)
    yield srv
    srv.stop()


def test_the_ensemble_answers_as_the_api(server, members, docs):
    first, second = members
    ensemble = Translator.load([first, second], device="cpu").translate(docs)
    single = Translator.load(first, device="cpu").translate(docs)
    assert ensemble != single  # the members differ, so serving one of them alone would show
    status, body = post(server.port, {"model": "ens", "documents": docs})
    assert status == 200, body
    assert body == {"model": "ens", "translations": ensemble}
    status, body = post(server.port, {"model": "single", "documents": docs})
    assert status == 200 and body["translations"] == single
    assert f"ens ({first} + {second})" in server.text()


def test_models_lists_the_members_by_file_name(server, members):
    first, second = members
    status, info = request(server.port, "GET", "/models")
    assert status == 200 and info["default"] == "ens"
    ens, single = info["models"]
    assert (ens["name"], ens["checkpoints"], ens["checkpoint"], ens["ensemble"]) == (
        "ens",
        ["last.pt", "noisy.pt"],
        None,
        True,
    )
    assert (single["checkpoints"], single["checkpoint"], single["ensemble"]) == (["last.pt"], "last.pt", False)
    assert ens["translate"]["ensemble_average"] == "log_prob"
    text = json.dumps(info)
    assert str(first.parent) not in text and str(second.parent) not in text, "GET /models shows the folders"


def test_ensemble_mistakes_are_one_line(members, tmp_path):
    first, second = members
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def start(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*SERVER, *args, "-port", "0"], capture_output=True, text=True, env=env, timeout=120)

    missing = str(tmp_path / "missing.pt")
    one_line_error(start("-model", f"ens={first}", missing), "missing.pt: checkpoint not found")
    one_line_error(start("-model", f"a={first}", f"b={second}"), "a name only goes before the first checkpoint")
    one_line_error(start("-model", f"ens={first}", str(second), "-ensemble_average", "max"), "-ensemble_average")
