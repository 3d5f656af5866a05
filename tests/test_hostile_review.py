"""tools/hostile_review.py: the pure helpers that decide what a case's outcome was. A mistake
here would silently misreport the library, so they are pinned down without running any command.
Loaded by path: benchmarks/ is not a package."""

from __future__ import annotations

import importlib.util
import io
import os
import pickle
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def hr():
    spec = importlib.util.spec_from_file_location("hostile_review", os.path.join(ROOT, "tools", "hostile_review.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["hostile_review"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("hostile_review", None)


def _zip(records: dict) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for name, data in records.items():
            z.writestr(name, data)
    return out.getvalue()


def test_error_lines_skip_progress_and_known_noise(hr):
    stderr = (
        "[10:15:57 INFO] no vocabulary in run: learning bpe\n"
        "no pair has frequency >= 2. Stopping\n\n"
        "[10:16:01 WARNING] something\n"
        "onmt_doc_train: error: x.yaml: bad\n"
    )
    assert hr.error_lines(stderr) == ["onmt_doc_train: error: x.yaml: bad"]


def test_traceback_detection_and_tail(hr):
    tb = 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n    f()\nRuntimeError: boom\n'
    assert hr.has_traceback(tb, 1, False)
    assert hr.traceback_tail(tb) == "RuntimeError: boom"
    assert hr.has_traceback("", -11, False)  # a segfault
    assert not hr.has_traceback("", -9, True)  # our own kill after a timeout is a stall, not a traceback
    assert not hr.has_traceback("prog: error: one line\n", 1, False)
    chained = (
        tb + "\nDuring handling of the above exception, another exception occurred:\n\n" + tb.replace("boom", "b2")
    )
    assert hr.traceback_tail(chained) == "RuntimeError: b2"


def test_judge_columns(hr):
    flags, problems = hr.judge(hr.REFUSE, 1, "prog: error: no\n", False)
    assert not any(flags.values()) and not problems
    flags, _ = hr.judge(hr.REFUSE, 0, "", False)
    assert flags["accepted_invalid"]
    flags, problems = hr.judge(hr.REFUSE, 1, "line one\nline two\n", False)
    assert flags["other"] and "2 stderr lines" in problems[0]
    flags, problems = hr.judge(hr.SUCCEED, 1, "prog: error: no\n", False)
    assert flags["other"] and "valid input refused" in problems[0]
    flags, _ = hr.judge(hr.EITHER, 0, "", False)
    assert not any(flags.values())
    flags, _ = hr.judge(hr.REFUSE, -9, "", True)
    assert flags["stall"] and not flags["traceback"]


def test_compare_damage_outputs_and_leftovers(hr):
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


def test_matches_globs(hr):
    assert hr.matches("run/checkpoints/last.pt", ["run/**"])
    assert hr.matches("run", ["run/**"])
    assert not hr.matches("runs/x", ["run/**"])
    assert hr.matches("run/checkpoints/step_12.pt", ["run/checkpoints/step_1[1-9].pt"])
    assert not hr.matches("run/checkpoints/step_10.pt", ["run/checkpoints/step_1[1-9].pt"])


def test_count_lines(hr):
    assert hr.count_lines(b"") == 0
    assert hr.count_lines(b"a\nb\n") == 2
    assert hr.count_lines(b"a\nb") == 2
    assert hr.count_lines(b"\n\n") == 2


def test_flip_middle_changes_only_the_tensor_record(hr):
    data = _zip({"archive/data.pkl": b"p" * 100, "archive/data/0": bytes(range(256)) * 4, "archive/version": b"3"})
    flipped = hr.flip_middle(data)
    assert len(flipped) == len(data) and flipped != data
    start, end = hr.record_span(data, r"/data/\d+$")
    diff = [i for i in range(len(data)) if data[i] != flipped[i]]
    assert diff and start <= diff[0] and diff[-1] < end
    with zipfile.ZipFile(io.BytesIO(flipped)) as z:  # still a zip, but the record's CRC no longer matches
        assert z.testzip() == "archive/data/0"


def test_evil_zip_keeps_checksums_and_carries_the_payload(hr):
    data = _zip({"archive/data.pkl": b"p", "archive/data/0": b"t" * 64})
    evil = hr.evil_zip(data)
    with zipfile.ZipFile(io.BytesIO(evil)) as z:
        assert z.testzip() is None
        payload = z.read("archive/data.pkl")
    assert b"system" in payload and b"PWNED" in payload
    with pytest.raises(pickle.UnpicklingError):  # what a restricted unpickler does with it
        _Restricted(io.BytesIO(payload)).load()


class _Restricted(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"{module}.{name} refused")


def test_line_mutations(hr):
    assert hr.insert_in_line(b"a\nb\nc\n", b"X") == b"a\nb\nXc\n"
    assert hr.insert_in_line(b"a\n", b"X", 5) == b"a\nX"
    assert hr.drop_line(b"0\n1\n2\n3\n4\n5\n") == b"0\n1\n2\n3\n5\n"


def test_duplicate_configs_name_the_key_twice(hr):
    for kind, (_, _, key) in hr.DUPLICATES.items():
        text = hr.dup_config(kind).decode()
        assert text.count(f"{key}:") >= 2 or text.count(f" {key}: ") >= 2, kind


def test_spread_and_table(hr):
    assert hr.spread(list(range(10)), 3) == [0, 3, 6]
    assert hr.spread([1, 2], None) == [1, 2]
    row = {"class": "x", "cases": 2, "pattern": "`cmd`", "behaved": 1, **dict.fromkeys(hr.COLUMNS, 0)}
    row["traceback"] = 1
    table = hr.markdown_table([row])
    assert "| x | 2 | 0 | 1 | 0 | 0 | 0 | 1 | `cmd` |" in table
    assert table.splitlines()[-1].startswith("| **all** | **2**")


def test_case_list_is_large_unique_and_covers_every_class(hr):
    cases = hr.all_cases()
    assert len(cases) >= 400
    assert len({c.ident for c in cases}) == len(cases)
    assert {c.cls for c in cases} == set(hr.CLASSES)
    for c in cases:
        assert c.expect in (hr.REFUSE, hr.SUCCEED, hr.EITHER)
        if c.runner == "cmd":  # a console script, or the benchmark runner (python -m benchmarks)
            assert c.argv[0].startswith("onmt_doc_") or c.argv[:3] == ["python", "-m", "benchmarks"], c.ident
    limited = hr.all_cases(["api"], 5)
    assert len(limited) == 5 and {c.cls for c in limited} == {"api"}


def test_duplicate_key_message_needs_the_key_and_both_lines(hr):
    import re

    good = "onmt_doc_train: error: cfg.yaml:7: duplicate key 'model.d_model' (first at line 6)"
    assert re.search(hr.dup_pattern("d_model"), good)
    assert not re.search(hr.dup_pattern("d_model"), "cfg.yaml: duplicate key 'model.d_model'")
    assert not re.search(hr.dup_pattern("train"), good)  # onmt_doc_train is not the key 'train'
