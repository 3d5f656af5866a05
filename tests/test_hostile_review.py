"""tools/hostile_review.py and its cases file: the pure helpers that decide what a case's outcome
was, and the reading of tools/hostile/cases.yaml into cases. A mistake here would silently
misreport the library, so they are pinned down without running the review (one small command case
is run for real, as the review runs it)."""

from __future__ import annotations

import io
import os
import pickle
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import hostile_review as hr  # tools/ is on the path (tests/conftest.py)
import pytest
import yaml
from hostile import fixtures, steps
from hostile.steps import Ctx


def _zip(records: dict) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for name, data in records.items():
            z.writestr(name, data)
    return out.getvalue()


def test_error_lines_skip_progress_and_known_noise():
    stderr = (
        "[10:15:57 INFO] no vocabulary in run: learning bpe\n"
        "no pair has frequency >= 2. Stopping\n\n"
        "[10:16:01 WARNING] something\n"
        "onmt_doc_train: error: x.yaml: bad\n"
    )
    assert steps.error_lines(stderr) == ["onmt_doc_train: error: x.yaml: bad"]


def test_traceback_detection_and_tail():
    tb = 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n    f()\nRuntimeError: boom\n'
    assert steps.has_traceback(tb, 1, False)
    assert hr.traceback_tail(tb) == "RuntimeError: boom"
    assert steps.has_traceback("", -11, False)  # a segfault
    assert not steps.has_traceback("", -9, True)  # our own kill after a timeout is a stall, not a traceback
    assert not steps.has_traceback("prog: error: one line\n", 1, False)
    chained = (
        tb + "\nDuring handling of the above exception, another exception occurred:\n\n" + tb.replace("boom", "b2")
    )
    assert hr.traceback_tail(chained) == "RuntimeError: b2"


def test_judge_columns():
    flags, problems = hr.judge(hr.REFUSE, 1, "prog: error: no\n", False)
    assert not any(flags.values()) and not problems
    flags, _ = hr.judge(hr.REFUSE, 0, "", False)
    assert flags["accepted_invalid"]
    flags, problems = hr.judge(hr.REFUSE, 1, "line one\nline two\n", False)
    assert flags["other"] and "2 stderr lines" in problems[0]
    flags, problems = hr.judge(hr.SUCCEED, 1, "prog: error: no\n", False)
    assert flags["other"] and "valid input refused" in problems[0]
    flags, _ = hr.judge(steps.EITHER, 0, "", False)
    assert not any(flags.values())
    flags, _ = hr.judge(hr.REFUSE, -9, "", True)
    assert flags["stall"] and not flags["traceback"]


def _api_case(line: str) -> steps.Case:
    """An API case from one line of the cases file's form."""
    return hr.make_case("api", {"name": "x", **yaml.safe_load(line)}, {})


def test_api_calls_are_judged_as_commands_are():
    """The worker's line of a call (rc 0 a return, 1 a UserError's message or a traceback) gives
    the columns a command's exit would."""
    ok = {"rc": 0, "stderr": "", "timed_out": False}
    refuse = _api_case("{code: 'T.load(None)'}")
    said = _api_case("{code: 'T.load(\"adir\")', message: director}")
    succeed = _api_case("{code: 'shape(t().translate([[]]), [0])', expect: succeed}")
    columns = lambda record: {k for k, v in record["flags"].items() if v}  # noqa: E731
    assert columns(hr.judge_api(refuse, ok)) == {"accepted_invalid"}
    assert columns(hr.judge_api(refuse, {**ok, "rc": 1, "stderr": "Translator.load: no model"})) == set()
    assert columns(hr.judge_api(said, {**ok, "rc": 1, "stderr": "adir: is a directory"})) == set()
    wrong = hr.judge_api(said, {**ok, "rc": 1, "stderr": "adir: not found"})
    assert columns(wrong) == {"other"} and "does not say 'director'" in wrong["problems"][0]
    tb = 'Traceback (most recent call last):\n  File "<string>", line 1\nTypeError: bad\n'
    crashed = hr.judge_api(refuse, {**ok, "rc": 1, "stderr": tb})
    assert columns(crashed) == {"traceback"} and crashed["traceback"] == "TypeError: bad"
    assert columns(hr.judge_api(refuse, {**ok, "rc": -1, "stderr": "the Python process died (exit -11): "})) == {
        "traceback"
    }
    assert columns(hr.judge_api(refuse, {"rc": None, "stderr": "", "timed_out": True})) == {"stall"}
    assert columns(hr.judge_api(succeed, {**ok, "lost": ["result has documents of [1]"]})) == {"damaged"}
    assert columns(hr.judge_api(succeed, {**ok, "pwned": True})) == {"damaged"}
    assert columns(hr.judge_api(succeed, ok)) == set()


def test_compare_damage_outputs_and_leftovers():
    f = {"kind": "file", "mode": 0o644, "size": 3, "sha256": "a"}
    before = {
        "in.txt": f,
        "out.txt": f,
        "dev": {"kind": "char", "mode": 0o666, "rdev": 7},
        "d": {"kind": "dir", "mode": 0o755},
    }
    after = {
        "in.txt": dict(f, sha256="b"),
        "out.txt": dict(f, sha256="c"),
        "dev": {"kind": "file", "mode": 0o644, "size": 0, "sha256": "x"},
        "d": {"kind": "dir", "mode": 0o755},
        ".out.txt.tmp123": f,
        "new.txt": f,
    }
    damage, leftovers = hr.compare(before, after, ["out.txt", "dev"])
    assert any(d.startswith("in.txt: content changed") for d in damage)
    assert not any(d.startswith("out.txt") for d in damage)  # a declared output may change
    assert any(d.startswith("dev: was a char") for d in damage)  # but a device must stay one
    assert leftovers == [".out.txt.tmp123"]
    damage, _ = hr.compare({"x": f}, {}, [])
    assert damage == ["x: was a file, now missing"]
    damage, _ = hr.compare({"run/.lock": f}, {"run/.lock": dict(f, sha256="z")}, [])
    assert damage == []  # the lock's holder text is rewritten by design
    cache = {
        "c/k/meta.json": {"kind": "link", "target": "/dev/zero"},
        "c/k/doc.offsets": {"kind": "dir", "mode": 0o755},
    }
    rebuilt = {"c/k/meta.json": f, "c/k/doc.offsets": f}
    assert len(hr.compare(cache, rebuilt, ["c/**"])[0]) == 2  # an output's link or folder must stay one …
    assert hr.compare(cache, rebuilt, [], ["c/**"])[0] == []  # … but a cache the toolkit rebuilds is its own


def test_snapshot_sees_content_mode_links_and_devices(tmp_path):
    (tmp_path / "a").write_bytes(b"x")
    os.symlink("a", tmp_path / "l")
    os.mkfifo(tmp_path / "f")
    before = hr.snapshot(tmp_path)
    assert {k: v["kind"] for k, v in before.items()} == {"a": "file", "l": "link", "f": "fifo"}
    (tmp_path / "a").write_bytes(b"y")
    os.chmod(tmp_path / "f", 0o600)
    damage, _ = hr.compare(before, hr.snapshot(tmp_path), [])
    assert [d.split(":")[0] for d in damage] == ["a", "f"]


def test_matches_globs():
    assert hr.matches("run/checkpoints/last.pt", ["run/**"])
    assert hr.matches("run", ["run/**"])
    assert not hr.matches("runs/x", ["run/**"])
    assert hr.matches("run/checkpoints/step_12.pt", ["run/checkpoints/step_1[1-9].pt"])
    assert not hr.matches("run/checkpoints/step_10.pt", ["run/checkpoints/step_1[1-9].pt"])


def test_count_lines():
    assert steps.count_lines(b"") == 0
    assert steps.count_lines(b"a\nb\n") == 2
    assert steps.count_lines(b"a\nb") == 2
    assert steps.count_lines(b"\n\n") == 2


def test_flip_middle_changes_only_the_tensor_record():
    data = _zip({"archive/data.pkl": b"p" * 100, "archive/data/0": bytes(range(256)) * 4, "archive/version": b"3"})
    flipped = fixtures.flip_middle(data)
    assert len(flipped) == len(data) and flipped != data
    start, end = fixtures.record_span(data, r"/data/\d+$")
    diff = [i for i in range(len(data)) if data[i] != flipped[i]]
    assert diff and start <= diff[0] and diff[-1] < end
    with zipfile.ZipFile(io.BytesIO(flipped)) as z:  # still a zip, but the record's CRC no longer matches
        assert z.testzip() == "archive/data/0"


def test_evil_zip_keeps_checksums_and_carries_the_payload():
    data = _zip({"archive/data.pkl": b"p", "archive/data/0": b"t" * 64})
    evil = fixtures.evil_zip(data)
    with zipfile.ZipFile(io.BytesIO(evil)) as z:
        assert z.testzip() is None
        payload = z.read("archive/data.pkl")
    assert b"system" in payload and b"PWNED" in payload
    with pytest.raises(pickle.UnpicklingError):  # what a restricted unpickler does with it
        _Restricted(io.BytesIO(payload)).load()


class _Restricted(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"{module}.{name} refused")


def test_line_mutations_and_text_arguments():
    assert fixtures.insert_in_line(b"a\nb\nc\n", b"X") == b"a\nb\nXc\n"
    assert fixtures.insert_in_line(b"a\n", b"X", 5) == b"a\nX"
    assert fixtures.drop_line(b"0\n1\n2\n3\n4\n5\n") == b"0\n1\n2\n3\n5\n"
    assert steps.data("\xff\xfe") == b"\xff\xfe"  # one byte a character, as the cases file writes bytes
    assert steps.data([["[", 3], "x"]) == b"[[[x"


def test_spread_and_table():
    assert hr.spread(list(range(10)), 3) == [0, 3, 6]
    assert hr.spread([1, 2], None) == [1, 2]
    row = {"class": "x", "cases": 2, "pattern": "`cmd`", "behaved": 1, **dict.fromkeys(hr.COLUMNS, 0)}
    row["traceback"] = 1
    table = hr.markdown_table([row])
    assert "| x | 2 | 0 | 1 | 0 | 0 | 0 | 1 | `cmd` |" in table
    assert table.splitlines()[-1].startswith("| **all** | **2**")


# ----------------------------------------------------------------------------- the cases file


def test_case_list_is_large_unique_and_covers_every_class():
    cases = hr.all_cases()
    assert len(cases) == 561  # docs/reliability.md's table: a new case is a new line there too
    assert len({c.ident for c in cases}) == len(cases)
    assert {c.cls for c in cases} == set(hr.load_classes())
    for c in cases:
        assert c.expect in (hr.REFUSE, hr.SUCCEED, steps.EITHER)
        if c.runner == "cmd":  # a console script, or the benchmark runner (python -m benchmarks)
            assert c.argv[0].startswith("onmt_doc_") or c.argv[:3] == ["python", "-m", "benchmarks"], c.ident
    limited = hr.all_cases(["api"], 5)
    assert len(limited) == 5 and {c.cls for c in limited} == {"api"}


RULES = {
    "hazards": [
        {
            "name": "valid",
            "vars": {"OUT": "out.dat"},
            "expect": "succeed",
            "checks": [["same_lines", "{LINES}", "out.dat"]],
        },
        {"name": "same-as-{EACH_NAME}", "for_each": "SAME_AS", "vars": {"OUT": "{EACH}"}},
        {"name": "missing-folder", "vars": {"OUT": "nowhere/out.dat"}},
    ],
    "commands": [
        {
            "name": "translate",
            "cmd": "onmt_doc_translate -src toy/test.src -output {OUT}",
            "vars": {"LINES": "toy/test.src", "SAME_AS": ["toy/test.src", "model.pt"]},
            "hazards": [["valid", "same-as-{EACH_NAME}"], "missing-folder"],
            "override": {"missing-folder": {"expect": "succeed", "outputs": ["nowhere/out.dat"]}},
        },
        {"name": "scale", "cmd": "onmt_doc_scale_model -output {OUT}", "hazards": ["valid"]},
    ],
}


def test_rules_cross_commands_with_hazards():
    """Each command makes one case per hazard it lists, named COMMAND/HAZARD, variables filled; a
    hazard with ``for_each`` makes one per value; ``override`` adds to one hazard; a check naming a
    variable the command lacks is left out."""
    cases = [hr.make_case("c", raw, variables) for raw, variables in hr.rule_cases(RULES)]
    by_name = {c.name: c for c in cases}
    assert list(by_name) == [
        "translate/valid",
        "translate/same-as-toy_test.src",
        "translate/same-as-model.pt",
        "translate/missing-folder",
        "scale/valid",
    ]
    assert by_name["translate/same-as-model.pt"].argv[-1] == "model.pt"
    assert by_name["translate/missing-folder"].expect == "succeed"
    assert by_name["translate/missing-folder"].outputs == ("nowhere/out.dat",)
    assert by_name["translate/same-as-model.pt"].expect == "refuse"
    assert len(by_name["translate/valid"].checks) == 1 and by_name["scale/valid"].checks == ()


@pytest.mark.parametrize(
    "raw,problem",
    [
        ({"cmd": "onmt_doc_translate", "ouputs": ["x"]}, "unknown fields"),
        ({"cmd": "onmt_doc_translate", "setup": [["derive", "x", "y", "no_such_transform"]]}, "no_such_transform"),
        ({"cmd": "onmt_doc_translate", "setup": [["no_such_step", "x"]]}, "no setup step"),
        ({"cmd": "onmt_doc_translate -output {NOPE}"}, "{NOPE} is not defined"),
        ({"scenario": "no-such-scenario"}, "no scenario"),
    ],
)
def test_a_typo_fails_the_load_not_the_run(raw, problem):
    with pytest.raises((SystemExit, KeyError), match=re.escape(problem)):
        hr.make_case("c", {"name": "x", **raw}, {})


def test_duplicate_key_cases_give_their_key_twice(tmp_path):
    """Every config case whose check wants a duplicate key named makes a config holding it twice."""
    made = 0
    for raw in hr.load_classes()["config"]["cases"]:
        keys = [c[1] for c in raw.get("checks", []) if c[0] == "duplicate_named"]
        if keys:
            case = hr.make_case("config", raw, {})
            steps.run_steps(Ctx(case, tmp_path, tmp_path, tmp_path / "stdout"), case.setup)
            text = (tmp_path / "cfg.yaml").read_text()
            assert len(re.findall(rf"\b{keys[0]}:", text)) >= 2, raw["name"]
            made += 1
    assert made >= 5


def test_duplicate_key_message_needs_the_key_and_both_lines():
    good = "onmt_doc_train: error: cfg.yaml:7: duplicate key 'model.d_model' (first at line 6)"
    assert re.search(steps.dup_pattern("d_model"), good)
    assert not re.search(steps.dup_pattern("d_model"), "cfg.yaml: duplicate key 'model.d_model'")
    assert not re.search(steps.dup_pattern("train"), good)  # onmt_doc_train is not the key 'train'


@pytest.mark.integration
@pytest.mark.skipif(not shutil.which("prlimit"), reason="the review runs each case under prlimit (util-linux)")
def test_a_command_case_runs_and_is_judged(tmp_path):
    """One case of the cases file's form run as the review runs it: its folder snapshotted, the
    command refused in one line, the user's file and the FIFO's reader untouched."""
    raw = {
        "name": "misaligned",
        "cmd": "onmt_doc_evaluate -hyp hyp.txt -ref ref.txt -json out.json",
        "stdout": "pipe",
        "setup": [["put", "hyp.txt", "a\nb\n"], ["put", "ref.txt", "a\n"], ["keep", "out.json"], ["fifo", "f"]],
        "fifo": "f",
        "checks": [["message_has", "line", "the refusal says the files differ in lines"]],
    }
    case = hr.make_case("x", raw, {})
    record = hr.run_command_case(case, tmp_path, tmp_path, tmp_path / "case")
    assert record["rc"] == 1 and record["behaved"], record
    assert (tmp_path / "case" / "out.json").read_bytes() == steps.PRECIOUS
    assert record["command"].endswith("-json out.json | cat")


def test_the_review_lists_its_cases():
    r = subprocess.run(
        ["python", str(Path(hr.__file__)), "--list", "--classes", "api", "--limit", "3"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(hr.__file__).parents[1])},
    )
    assert r.returncode == 0, r.stderr
    assert [line.split("\t")[0] for line in r.stdout.splitlines()] == [c.ident for c in hr.all_cases(["api"], 3)]
