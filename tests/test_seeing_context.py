"""Issue 44, "See what context does", as a person uses it: a toy G-Transformer trained with
``log.pictures`` shows its pictures in TensorBoard; ``onmt_doc_evaluate -explain`` writes the
pictures and a page; the server's ``"explain": true`` and its page at ``/``, driven in headless
Chromium, translate a three-sentence document exactly as the API does.

The browser test needs Debian's ``chromium`` and ``chromium-driver`` and PyPI's ``selenium``
(.ci/run installs them); without them it is skipped, with the reason.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import module_cmd, run_cli, tiny_config

pytest.importorskip("matplotlib", reason="the viz extra is not installed (pip install -e .[viz])")
pytest.importorskip("flask", reason="the server extra is not installed (pip install -e .[server])")

from test_server import Server, post, request  # noqa: E402

pytestmark = pytest.mark.integration  # trains a model and starts processes

DOC = ["the big dog sleeps .", "it sees a cat in the garden .", "a small bird sings ."]


@pytest.fixture(scope="module")
def g_run(toy_dir, tmp_path_factory) -> Path:
    """A tiny G-Transformer trained until it translates into words (what the page is checked on),
    with a picture at every validation."""
    from onmt_doc.config import config_from_dict
    from onmt_doc.train.trainer import train

    run = tmp_path_factory.mktemp("g_pictures")
    layers = {"layers": 2, "heads": 4, "ff": 128, "global_layers": 1}
    cfg = tiny_config(
        toy_dir,
        run,
        model={
            "encoder": {"type": "g_transformer", **layers},
            "decoder": {"type": "g_transformer", **layers, "global_cross_layers": 1},
        },
        data={"documents": True, "max_tokens": 128},
        train={"max_steps": 120, "valid_every": 60, "save_every": 120},  # enough to translate into words
        optim={"lr": 4e-3},
        log={"tensorboard": True, "pictures": 1, "picture_documents": 1},
    )
    cfg["data"]["valid"]["src"], cfg["data"]["valid"]["tgt"] = short_valid(toy_dir, run)
    train(config_from_dict(cfg))
    return run


def short_valid(toy_dir: Path, run: Path) -> tuple[str, str]:
    """The first five validation documents: validation stays quick."""
    out = []
    for ext in ("src", "tgt"):
        docs = (toy_dir / f"valid.{ext}").read_text(encoding="utf-8").split("\n\n")[:5]
        (run / f"valid5.{ext}").write_text("\n\n".join(d.strip("\n") for d in docs) + "\n", encoding="utf-8")
        out.append(str(run / f"valid5.{ext}"))
    return out[0], out[1]


def test_tensorboard_shows_the_pictures_at_every_validation(g_run):
    from tensorboard.backend.event_processing.event_accumulator import IMAGES, EventAccumulator

    events = EventAccumulator(str(g_run / "tensorboard"), size_guidance={IMAGES: 0})
    events.Reload()
    tags = set(events.Tags()["images"])
    expected = {
        f"pictures/doc1/{name}"
        for name in (
            "global_cross_attention_tokens",
            "global_cross_attention_sentences",
            "global_self_attention_tokens",
            "global_self_attention_sentences",
            "global_weight",
        )
    }
    assert tags == expected, tags
    for tag in expected:
        images = events.Images(tag)
        assert [i.step for i in images] == [60, 120]
        assert images[0].encoded_image_string.startswith(b"\x89PNG") and images[0].width > 100


@pytest.fixture(scope="module")
def doc_files(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("doc")
    (d / "doc.src").write_text("\n".join(DOC) + "\n", encoding="utf-8")
    (d / "doc.tgt").write_text("der hund grosser schlaeft .\ner sieht eine katze in dem garten .\n"
                               "ein vogel kleiner singt .\n", encoding="utf-8")  # fmt: skip
    return d / "doc.src", d / "doc.tgt"


def evaluate(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_cli(*module_cmd("onmt_doc.bin.evaluate"), *args, env=env)


def test_explain_writes_the_pictures_and_a_page(g_run, doc_files, tmp_path):
    src, ref = doc_files
    ckpt = str(g_run / "checkpoints" / "last.pt")
    out = tmp_path / "explained"
    proc = evaluate("-model", ckpt, "-explain", str(src), "-ref", str(ref), "-output", str(out), "-json", "-")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["explain"]["sentences"] == 3
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "global_cross_attention_sentences.png",
        "global_cross_attention_tokens.png",
        "global_self_attention_sentences.png",
        "global_self_attention_tokens.png",
        "global_weight.png",
        "index.html",
    ]
    for p in out.glob("*.png"):
        assert p.read_bytes().startswith(b"\x89PNG")
    page = (out / "index.html").read_text(encoding="utf-8")
    for sentence in DOC:
        assert sentence.split()[1] in page
    from onmt_doc import Translator

    codec = Translator.load(ckpt, device="cpu").codec  # the reference's subword tokens, each a coloured span
    assert page.count('class="tok r') == sum(len(ids) for ids in codec.encode(ref.read_text().splitlines(), "tgt"))
    assert "P-CXMI" in page and "reliance" in page
    assert page.count('src="data:image/png;base64,') == 5  # one file: the pictures are in it
    assert "http://" not in page and "https://" not in page  # nothing loads from elsewhere
    # the same folder again: refused unless -force, which replaces it
    again = evaluate("-model", ckpt, "-explain", str(src), "-output", str(out))
    assert again.returncode != 0 and "-force" in again.stderr and len(again.stderr.strip().splitlines()) == 1
    assert evaluate("-model", ckpt, "-explain", str(src), "-output", str(out), "-force").returncode == 0
    assert "P-CXMI" not in (out / "index.html").read_text(encoding="utf-8")  # no reference: no P-CXMI


def test_explain_mistakes_are_one_line_errors(g_run, doc_files, tmp_path):
    src, _ = doc_files
    ckpt = str(g_run / "checkpoints" / "last.pt")
    two = tmp_path / "two.src"
    two.write_text("a b .\n\nc d .\n", encoding="utf-8")
    hidden = tmp_path / "no_matplotlib" / "matplotlib"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n", encoding="utf-8")
    no_mpl = {"PYTHONPATH": os.pathsep.join([str(hidden.parent), os.environ.get("PYTHONPATH", "")])}
    cases = [
        (["-model", ckpt, "-explain", str(src)], {}, "-explain needs -model and -output"),
        (["-model", ckpt, "-explain", str(two), "-output", str(tmp_path / "o")], {}, "2 documents; give one"),
        (["-model", ckpt, "-explain", str(src), "-output", str(src.parent)], {}, "holds the -explain file"),
        (["-model", ckpt, "-explain", str(src), "-output", str(tmp_path / "o")], no_mpl, "pip install -e .[viz]"),
        (["-model", ckpt, "-hyp", str(src), "-output", str(tmp_path / "o")], {}, "-output and -force go with -explain"),
    ]
    for args, env, needle in cases:
        proc = evaluate(*args, env=env)
        assert proc.returncode == 1, (args, proc.stderr)
        assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()
    assert src.read_text(encoding="utf-8") == "\n".join(DOC) + "\n"  # the input is untouched


# ----------------------------------------------------------------------------- the server


@pytest.fixture(scope="module")
def g_server(g_run, tmp_path_factory):
    d = tmp_path_factory.mktemp("g_server")
    (d / "key").write_text("page-Key_42\n", encoding="utf-8")
    ckpt = g_run / "checkpoints" / "last.pt"
    srv = Server(["-model", f"toy_g={ckpt}", "-port", "0", "-api_key_file", str(d / "key"), "-max_sentences", "5"],
                 d / "server.log")  # fmt: skip
    yield srv
    srv.stop()


KEY = {"Authorization": "Bearer page-Key_42"}


def test_explain_in_the_api(g_server, g_run):
    from onmt_doc import Translator
    from onmt_doc.evaluation.context_reading import read_document

    port = g_server.port
    status, reply = post(port, {"document": DOC, "explain": True}, headers=KEY)
    assert status == 200, reply
    api = Translator.load(g_run / "checkpoints" / "last.pt", device="cpu")
    assert reply["translation"] == api.translate([DOC])[0]
    want = read_document(api, DOC, reply["translation"]).to_json()
    sentences = reply["explanation"]["sentences"]
    assert [s["target"] for s in sentences] == [s["target"] for s in want["sentences"]]
    for got, expected in zip(sentences, want["sentences"]):
        assert got["measures"].keys() == expected["measures"].keys()
        for name in got["measures"]:
            assert got["measures"][name] == pytest.approx(expected["measures"][name], abs=2e-4)
    assert len(sentences) == 3 and all(len(s["context"]) == 3 for s in sentences)
    assert all(0 <= r <= 1 for s in sentences for r in s["measures"]["reliance"])
    status, plain = post(port, {"documents": [DOC]}, headers=KEY)
    assert status == 200 and "explanation" not in plain  # opt-in
    for payload, needle in (
        ({"document": DOC, "explain": "yes"}, "'explain' must be true or false"),
        ({"document": DOC, "explain": True, "context": ["a b ."]}, "without 'context'"),
    ):
        status, reply = post(port, payload, headers=KEY)
        assert status == 400 and needle in reply["error"], reply
    status, reply = post(port, {"document": DOC * 2, "explain": True}, headers=KEY)
    assert status == 413 and "-max_sentences" in reply["error"]  # the limits hold
    assert post(port, {"document": DOC, "explain": True})[0] == 401  # and so does the key


def get_page(port: int) -> tuple[int, str, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", "/")
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8"), response
    finally:
        conn.close()


def test_the_page_is_served_without_the_key_and_loads_nothing_from_elsewhere(g_server):
    status, page, response = get_page(g_server.port)
    assert status == 200 and response.getheader("Content-Type").startswith("text/html")
    assert "default-src 'none'" in response.getheader("Content-Security-Policy")
    assert "http://" not in page and "https://" not in page and "<script src" not in page
    assert "fetch(path" in page and '"/translate"' in page and '"/models"' in page  # the JSON API
    assert request(g_server.port, "GET", "/models")[0] == 401  # the data still needs the key


def browser():
    """A headless Chromium driven by selenium, or the reason there is none."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None, "selenium is not installed (pip install selenium)"
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not binary or not driver:
        return None, "no Chromium (apt-get install -y chromium chromium-driver)"
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1200,900",
    ):
        options.add_argument(flag)
    return (webdriver, Service(executable_path=driver), options), ""


def test_the_page_translates_a_document_in_headless_chromium(g_server, tmp_path):
    found, reason = browser()
    if found is None:
        pytest.skip(reason)
    webdriver, service, options = found
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    options.add_argument(f"--user-data-dir={tmp_path / 'profile'}")
    os.environ.setdefault("SE_OFFLINE", "true")  # selenium's driver manager never downloads
    driver = webdriver.Chrome(service=service, options=options)
    try:
        wait = WebDriverWait(driver, 120)
        driver.get(f"http://127.0.0.1:{g_server.port}/")
        wait.until(ec.text_to_be_present_in_element((By.ID, "status"), "API key"))  # /models answered 401
        driver.find_element(By.ID, "key").send_keys("page-Key_42")
        driver.find_element(By.ID, "retry").click()
        wait.until(ec.element_to_be_clickable((By.ID, "translate")))
        assert "toy_g" in driver.find_element(By.ID, "model").text
        upload = tmp_path / "document.txt"  # uploaded, as a person would pick a file
        upload.write_text("\n".join(DOC) + "\n", encoding="utf-8")
        driver.find_element(By.ID, "file").send_keys(str(upload))
        wait.until(lambda d: d.find_element(By.ID, "text").get_attribute("value").strip())
        assert driver.find_element(By.ID, "text").get_attribute("value").split("\n")[:3] == DOC
        driver.find_element(By.ID, "translate").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "status"), "Translated 3 sentences"))
        shown = [td.text for td in driver.find_elements(By.CSS_SELECTOR, "#result td.translation")]
        sources = [td.text for td in driver.find_elements(By.CSS_SELECTOR, "#result td.source")]
        titles = [t.get_attribute("title") for t in driver.find_elements(By.CSS_SELECTOR, "td.reading span.tok")]
        driver.save_screenshot(str(tmp_path / "page.png"))
    finally:
        driver.quit()
    status, reply = post(g_server.port, {"document": DOC, "explain": True}, headers=KEY)
    assert sum(c.isalpha() for s in reply["translation"] for c in s) > 10  # words, so the comparison means something
    assert status == 200 and shown == reply["translation"] and sources == DOC
    reliance = [r for s in reply["explanation"]["sentences"] for r in s["measures"]["reliance"]]
    assert [float(t.split(";")[0].removeprefix("reliance ")) for t in titles] == pytest.approx(reliance, abs=1e-3)
    assert (tmp_path / "page.png").read_bytes().startswith(b"\x89PNG")
    keep = os.environ.get("ONMT_DOC_SCREENSHOT")  # docs/seeing_context.md's screenshot is made with it
    if keep:
        shutil.copy(tmp_path / "page.png", keep)
