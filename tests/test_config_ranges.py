"""Nothing silently replaced or let through: duplicate YAML keys, values out of range, NaN and
infinities, translation options past their caps, and model sizes no machine can allocate are each
refused in one line naming the file (or the option) and the key."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
from conftest import module_cmd, run_cli
from model_helpers import random_model

from onmt_doc.config import Config, config_from_dict, config_to_dict, load_config
from onmt_doc.errors import ConfigError
from onmt_doc.registry import registry_for

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)

# ------------------------------------------------------------------------------ helpers

# a natural partner for each registered encoder and decoder (builds without unit mismatches)
PAIRS = [
    ("transformer", "transformer"),
    ("transformer", "gated_transformer"),
    ("transformer", "mhplstm"),
    ("g_transformer", "g_transformer"),
    ("hierarchical", "doc_context"),
    ("embedding", "reformer"),
]
# each kind of part with a section of its own, and where that section sits (labels of every_key)
PART_SECTIONS = {"encoder": "model.encoder", "decoder": "model.decoder", "loss": "loss", "schedule": "optim.schedule"}
# written by hand: the probabilities the issue names, whatever the code marks
EXPECTED_PROBABILITIES = {
    "model.dropout",
    "model.attention_dropout",
    "model.word_dropout",
    "model.encoder[hierarchical].context_dropout",
    "loss[label_smoothed_ce].smoothing",
}


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "x.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def placed(kind: str, name: str, keys: dict) -> dict:
    """A raw config holding registered part ``name`` of ``kind`` with ``keys`` in its section."""
    section = {"type": name, **keys}
    if kind == "encoder":
        return {"model": {"encoder": section}}
    if kind == "decoder":
        return {"model": {"decoder": section}}
    if kind == "loss":
        return {"loss": [section]}
    return {"optim": {"schedule": section}}


def every_key() -> list[tuple[str, dataclasses.Field, type, typing.Callable[[object], dict]]]:
    """(label, field, type, raw config with the key set to a value) for every key of every section
    and every registered encoder, decoder, loss and schedule (nested sections such as data.train too)."""
    found = []

    def walk(cls: type, label: str, build: typing.Callable[[object], dict]) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name == "type" or f.metadata.get("part"):
                continue
            tp = hints[f.name]
            setter = (lambda name: lambda v: build({name: v}))(f.name)
            if dataclasses.is_dataclass(tp):
                walk(tp, f"{label}.{f.name}", setter)
            else:
                found.append((f"{label}.{f.name}", f, tp, setter))

    for section in dataclasses.fields(Config):
        if section.metadata.get("part") or not dataclasses.is_dataclass(typing.get_type_hints(Config)[section.name]):
            continue  # top-level plain keys (plugins: a list of paths) hold no numbers
        walk(typing.get_type_hints(Config)[section.name], section.name, lambda v, s=section.name: {s: v})
    walk(typing.get_type_hints(Config)["optim"], "optim", lambda v: {"optim": v})
    for kind, label in PART_SECTIONS.items():
        for name in registry_for(kind).names():
            walk(registry_for(kind).get(name).config, f"{label}[{name}]", lambda v, k=kind, n=name: placed(k, n, v))
    return found


def key_path(label: str) -> str:
    """The key path an error names: ``model.encoder[hierarchical].context_dropout`` ->
    ``model.encoder.context_dropout``, ``loss[x].smoothing`` -> ``loss.0.smoothing``."""
    if label.startswith("loss["):
        return "loss.0." + label.split("].", 1)[1]
    return label.split("[")[0] + ("." + label.split("].", 1)[1] if "[" in label else "")


def probability_keys() -> list[tuple[str, typing.Callable[[object], dict]]]:
    """Float keys marked as probabilities (bounds [0, 1)) or named like one (``*dropout``,
    ``smoothing``), so a new dropout key without its bounds is caught here."""
    keys = []
    for label, f, tp, build in every_key():
        bounds = f.metadata.get("bounds")
        marked = bounds is not None and (bounds.minimum, bounds.below) == (0, 1)
        named = f.name.endswith("dropout") or f.name == "smoothing"
        if tp is float and (marked or named):  # lists of probabilities (optim.betas): tested below
            keys.append((label, build))
    return keys


# ------------------------------------------------------------------------------ duplicate keys


def test_a_section_written_twice_names_the_key_and_both_lines(tmp_path):
    path = write(tmp_path, "train:\n  max_steps: 3\nlog:\n  every: 5\ntrain:\n  accum: 2\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value) == f"{path}:5: duplicate key 'train' (first at line 1)"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "model:\n  encoder:\n    layers: 2\n    heads: 4\n    layers: 3\n",
            ":5: duplicate key 'model.encoder.layers' (first at line 3)",
        ),
        (
            "loss:\n  - type: label_smoothed_ce\n    weight: 1\n    weight: 2\n",
            ":4: duplicate key 'loss.0.weight' (first at line 3)",
        ),
        (
            "optim: {lr: 0.1, params: {momentum: 0.9, momentum: 0.5}}\n",
            ":1: duplicate key 'optim.params.momentum' (first at line 1)",
        ),
    ],
)
def test_duplicate_keys_are_refused_at_any_depth(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value) == path + message


def test_merge_keys_may_be_overridden_and_loading_stays_safe(tmp_path):
    """``<<: *anchor`` then a key of the anchor is YAML's way to override, not a duplicate; Python
    tags stay refused (safe loading)."""
    cfg = load_config(
        write(tmp_path, "model:\n  encoder: &enc {layers: 2, heads: 4}\n  decoder:\n    <<: *enc\n    layers: 3\n")
    )
    assert (cfg.model.decoder.layers, cfg.model.decoder.heads, cfg.model.encoder.layers) == (3, 4, 2)
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(write(tmp_path, "log: {dir: !!python/object/apply:os.getcwd []}\n"))


def test_a_duplicate_key_in_an_override_value_is_refused():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["optim.params={momentum: 0.9, momentum: 0.5}"])
    assert str(e.value) == "command line: override 'optim.params': duplicate key 'momentum'"


# ------------------------------------------------------------------------------ ranges


def test_every_probability_of_every_part_is_refused_outside_0_1():
    """Each dropout-like key, of the model and of every registered part, refuses 1.0 and -0.1 in one
    line naming it, and takes 0 and 0.5."""
    keys = probability_keys()
    assert EXPECTED_PROBABILITIES <= {label for label, _ in keys}
    for label, build in keys:
        path = key_path(label)
        for bad in (1.0, -0.1):
            with pytest.raises(ConfigError) as e:
                config_from_dict(build(bad), "x.yaml")
            assert str(e.value) == f"x.yaml: {path}: must be in [0, 1), got {bad}", label
        for good in (0.0, 0.5):
            config_from_dict(build(good), "x.yaml")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.encoder.heads=0", "model.encoder.heads: must be at least 1, got 0"),
        ("model.decoder.ff=0", "model.decoder.ff: must be at least 1, got 0"),
        ("model.decoder.layers=-1", "model.decoder.layers: must be at least 0, got -1"),
        ("model.max_positions=0", "model.max_positions: must be at least 1, got 0"),
        ("optim.lr=-0.1", "optim.lr: must be at least 0, got -0.1"),
        ("optim.betas=[1.0,0.98]", "optim.betas.0: must be in [0, 1), got 1.0"),
        ("optim.schedule.warmup=-5", "optim.schedule.warmup: must be at least 0, got -5"),
        ("loss.0.weight=-1", "loss.0.weight: must be at least 0, got -1.0"),
        ("train.valid_beam=257", "train.valid_beam: must be in [1, 256], got 257"),
        ("translate.beam=257", "translate.beam: must be in [1, 256], got 257"),
        ("translate.max_len_ratio=0", "translate.max_len_ratio: must be greater than 0, got 0.0"),
        ("translate.temperature=0", "translate.temperature: must be greater than 0, got 0.0"),
        ("translate.top_p=1.5", "translate.top_p: must be in (0, 1], got 1.5"),
    ],
)
def test_counts_sizes_and_ratios_out_of_range_are_one_line_errors(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert str(e.value) == f"command line: {message}"


# ------------------------------------------------------------------------------ NaN and infinities


@pytest.mark.parametrize(
    ("value", "text"), [(float("nan"), ".nan"), (float("inf"), ".inf"), (float("-inf"), "-.inf"), ("1e999", "1e999")]
)
def test_nan_and_infinities_are_refused_in_every_float_key(value, text):
    """Every float key of every section and registered part, as YAML reads it (``1e999``: a string
    that reads as a float), and through command-line overrides."""
    floats = [(label, build) for label, _, tp, build in every_key() if tp is float]
    assert len(floats) >= 15
    for label, build in floats:
        with pytest.raises(ConfigError) as e:
            config_from_dict(build(value), "x.yaml")
        assert str(e.value) == f"x.yaml: {key_path(label)}: expected a finite number, got {float(value)}", label
    for override in ("model.dropout", "optim.lr", "translate.length_penalty"):
        with pytest.raises(ConfigError) as e:
            load_config(None, [f"{override}={text}"])
        assert str(e.value) == f"command line: {override}: expected a finite number, got {float(value)}"


def test_nan_inside_lists_and_free_mappings_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"x\.yaml: optim\.betas\.1: expected a finite number, got nan"):
        load_config(write(tmp_path, "optim: {betas: [0.9, .nan]}\n"))
    with pytest.raises(ConfigError, match=r"x\.yaml: optim\.params\.momentum: expected a finite number, got inf"):
        load_config(write(tmp_path, "optim: {type: sgd, params: {momentum: .inf}}\n"))


# ------------------------------------------------------------------------------ translation options


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    """A random-weight Transformer checkpoint (no training needed to check options)."""
    from onmt_doc.models.checkpoint import save_checkpoint

    section = {"encoder": {"layers": 1, "heads": 2, "ff": 32}, "decoder": {"layers": 1, "heads": 2, "ff": 32}}
    model, codec = random_model(section)
    cfg = config_from_dict({"model": {"d_model": 32, **section}})
    path = tmp_path_factory.mktemp("ranges") / "m.pt"
    save_checkpoint({"config": config_to_dict(cfg), "codec": codec.to_dict(), "model": model.state_dict()}, str(path))
    return path


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"n_best": 0}, "translate options: n_best: must be in [1, 256], got 0"),
        ({"beam": 257}, "translate options: beam: must be in [1, 256], got 257"),
        ({"strategy": "sampling", "n_best": 300}, "translate options: n_best: must be in [1, 256], got 300"),
        ({"max_len_ratio": 0.0}, "translate options: max_len_ratio: must be greater than 0, got 0.0"),
        ({"length_penalty": float("nan")}, "translate options: length_penalty: expected a finite number, got nan"),
        ({"temperature": float("inf")}, "translate options: temperature: expected a finite number, got inf"),
        ({"top_p": 0.0}, "translate options: top_p: must be in (0, 1], got 0.0"),
        ({"max_length": 0}, "translate options: max_length: must be at least 1, got 0"),
    ],
)
def test_translator_load_refuses_options_out_of_range(ckpt, options, message):
    """The API, the commands and the server all go through Translator.load's options."""
    from onmt_doc.translate.translator import Translator

    with pytest.raises(ConfigError) as e:
        Translator.load(ckpt, device="cpu", **options)
    assert str(e.value) == message


def test_translate_command_names_its_flag_in_one_line(ckpt, tmp_path):
    src = tmp_path / "src.txt"
    src.write_text("w1 w2\n", encoding="utf-8")
    proc = run_cli(*module_cmd("onmt_doc.bin.translate"), "-model", str(ckpt), "-src", str(src), "-beam", "1000")
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].endswith("-beam: must be in [1, 256], got 1000")
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------------------ sizes that cannot be allocated


@pytest.mark.parametrize(
    ("override", "key", "at_least_gb"),
    [
        # 6 decoder layers, each two 512 x 4e9 float32 matrices: at least 98,304 GB whatever else
        ("model.decoder.ff=4000000000", "model.decoder.ff 4000000000", 98_304),
        # 12 layers of four 1e7 x 1e7 attention projections
        ("model.d_model=10000000", "model.d_model 10000000", 12 * 4 * 4e14 / 1e9),
        ("model.max_positions=100000000000", "model.max_positions 100000000000", 4 * 512 * 1e11 / 1e9),
    ],
)
def test_a_model_too_large_to_allocate_is_refused_naming_the_key(override, key, at_least_gb):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    message = str(e.value)
    assert message.startswith(f"command line: {key}: the model would need ~") and "\n" not in message
    need = float(message.split("~")[1].split(" GB")[0].replace(",", ""))
    assert need >= at_least_gb * 0.999 and "GB of memory" in message


@pytest.mark.parametrize(("encoder", "decoder"), PAIRS)
def test_the_size_estimate_is_a_lower_bound_of_the_built_model(encoder, decoder):
    """Never refuse a model that fits: each part's estimate is at most its real parameter count."""
    section = {
        "encoder": {"type": encoder, **({"layers": 2, "ff": 48} if encoder != "embedding" else {})},
        "decoder": {"type": decoder, "layers": 2, "ff": 48},
    }
    model, _ = random_model(section)
    cfg = config_from_dict({"model": {"d_model": 32, **section}}).model
    for part, module in ((cfg.encoder, model.encoder), (cfg.decoder, model.decoder)):
        real = sum(p.numel() for p in module.parameters())
        assert 0 <= part.parameter_estimate(32) <= real, (part.type, real)
