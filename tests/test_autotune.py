"""The autotuner without a GPU: a stand-in timer measures, so what is tested is the choice, the cache (a
second call measures nothing; a changed kernel, a damaged or foreign entry, an untrusted folder each
mean measuring afresh, with a warning where something was wrong), refusals recorded per configuration,
parallel compiles in worker processes with a progress line, and the CLI's refusals."""
import json
import os
import warnings

import pytest

from cbrules.autotune import TuneCacheWarning, TuneError, autotune, tune_dir
from cbrules.cli import main
from cbrules.kernels.attention import attention
from cbrules.kernels.reductions import inner_reduction

CONFIGS = [{"width": 256}, {"width": 512}, {"width": 256, "stages": 2}]
COST = {256: 3e-6, 512: 2e-6}  # the stand-in timer: width 512 is the fastest


@pytest.fixture(autouse=True)
def tune_folder(tmp_path, monkeypatch):
    folder = tmp_path / "tune"
    monkeypatch.setenv("CBRULES_TUNE_DIR", str(folder))
    return folder


def _timer(calls):
    """Seconds by configuration, recognised by its generated CUDA (the timer sees the compiled kernel)."""
    from cbrules import api
    by_source = {api.generate(inner_reduction(**c)).text: COST[c["width"]] for c in CONFIGS}

    def timer(compiled, args):
        calls.append(compiled.source.text)
        return by_source[compiled.source.text]
    return timer


def _tune(calls, **kw):
    lines = []
    choice = autotune("inner_reduction", inner_reduction, CONFIGS, {"shape": [64, 4096]}, {}, workers=1,
                      timer=_timer(calls), device="test-device", progress=lines.append, **kw)
    return choice, lines


def test_the_fastest_is_chosen_and_a_second_call_measures_nothing(tune_folder):
    calls = []
    choice, lines = _tune(calls)
    assert choice.config == {"width": 512} and not choice.cached and len(calls) == 3
    assert [t.seconds for t in choice.trials] == [3e-6, 2e-6, 3e-6]
    assert "compiled 3/3" in lines[2] and "<- chosen" in choice.table().splitlines()[1]
    assert choice.kernel.source.name == "inner_reduction"
    (entry,) = tune_folder.iterdir()
    calls.clear()
    again, _ = _tune(calls)
    assert again.cached and again.config == {"width": 512} and calls == []  # from the cache: no measuring
    assert [t.seconds for t in again.trials] == [3e-6, 2e-6, 3e-6]
    other = autotune("inner_reduction", inner_reduction, CONFIGS, {"shape": [64, 8192]}, {}, workers=1,
                        timer=_timer(calls), device="test-device", progress=lambda _: None)
    assert not other.cached and len(list(tune_folder.iterdir())) == 2  # another key, another entry


def test_a_choice_that_generates_other_cuda_now_is_measured_afresh(tune_folder):
    calls = []
    _tune(calls)
    (path,) = tune_folder.iterdir()
    entry = json.loads(path.read_text())
    entry["source_hash"] = "0" * 64  # as if the rules had changed what the configuration generates
    path.write_text(json.dumps(entry))
    calls.clear()
    choice, lines = _tune(calls)
    assert not choice.cached and len(calls) == 3 and any("no longer generates" in ln for ln in lines)


@pytest.mark.parametrize("damage", ["garbage", "foreign", "folder", "link"])
def test_a_damaged_entry_is_a_warning_and_a_fresh_measurement(tune_folder, damage):
    calls = []
    _tune(calls)
    (path,) = tune_folder.iterdir()
    if damage == "garbage":
        path.write_bytes(b"\xff{not json")
    elif damage == "foreign":
        entry = json.loads(path.read_text())
        path.write_text(json.dumps({**entry, "key": {"shape": [1, 1]}}))
    elif damage == "folder":
        path.unlink()
        path.mkdir()
    else:
        target = tune_folder / "elsewhere.json"
        path.rename(target)
        path.symlink_to(target)
    calls.clear()
    with pytest.warns(TuneCacheWarning):
        choice, _ = _tune(calls)
    assert not choice.cached and len(calls) == 3


def test_an_untrusted_folder_is_not_used(tune_folder):
    tune_folder.mkdir()
    os.chmod(tune_folder, 0o777)
    calls = []
    with pytest.warns(TuneCacheWarning, match="writable by every user"):
        _tune(calls)
    assert list(tune_folder.iterdir()) == []


def test_cache_false_neither_reads_nor_writes(tune_folder):
    calls = []
    _tune(calls, cache=False)
    assert not tune_folder.exists()


def test_refused_configurations_are_recorded_and_left_out():
    calls = []
    configs = [{"warp_specialize": True, "persistent": 4}, {"warp_specialize": True}, {"nonsense": 1}]

    def timer(compiled, args):
        calls.append(1)
        return 1e-3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        choice = autotune("attention causal", lambda **c: attention(head_dim=64, causal=True, **c), configs,
                          "k", {}, workers=1, timer=timer, device="d", progress=lambda _: None)
    assert choice.config == {"warp_specialize": True} and len(calls) == 1
    errors = {json.dumps(t.config): t.error for t in choice.trials if t.error}
    assert "causal=True" in errors['{"warp_specialize": true, "persistent": 4}']
    assert "nonsense" in errors['{"nonsense": 1}']
    with pytest.raises(TuneError, match="no configuration ran"):
        autotune("attention causal", lambda **c: attention(head_dim=64, causal=True, **c), configs[:1], "k2", {},
                 workers=1, timer=timer, device="d", progress=lambda _: None)


def test_requests_refused_by_name():
    for name, configs, key, what in (("", CONFIGS, "k", "name"), ("x", [], "k", "no configurations"),
                                     ("x", [{"a": 1}, {"a": 1}], "k", "twice"),
                                     ("x", [{"a": object()}], "k", "plain data"), ("x", CONFIGS, object(), "plain")):
        with pytest.raises(TuneError, match=what):
            autotune(name, inner_reduction, configs, key, {}, timer=lambda c, a: 1.0, device="d")


def test_workers_compile_in_parallel_with_a_progress_line():
    """Worker processes import the builder by name (never this test's module as a script)."""
    calls, lines = [], []
    choice = autotune("inner_reduction", inner_reduction, CONFIGS, "parallel", {}, workers=2,
                      timer=_timer(calls), device="test-device", progress=lines.append)
    assert choice.config == {"width": 512} and not any("in this process" in ln for ln in lines)
    assert [ln for ln in lines if "compiled" in ln][-1] == "tune inner_reduction: compiled 3/3"
    lines.clear()
    autotune("local builder", lambda **c: inner_reduction(**c), CONFIGS[:2], "local", {}, workers=2,
             timer=_timer(calls), device="test-device", progress=lines.append)
    assert any("cannot go to a worker" in ln for ln in lines)  # a lambda: compiled here


def test_the_default_folder(monkeypatch):
    monkeypatch.delenv("CBRULES_TUNE_DIR")
    assert tune_dir().parts[-3:] == (".cache", "cbrules", "tune")


def test_the_cli_refuses_by_name(capsys):
    assert main(["tune", "exp1d_tma"]) == 2
    assert "declared configurations of matmul_tc, attention" in capsys.readouterr().err
    for argv, what in ((["tune", "matmul_tc", "--workers", "0"], "0 is too small"),
                       (["tune", "matmul_tc", "--workers", "x"], "is not an integer")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert what in err and "Traceback" not in err
    from cbrules.codegen import runtime
    if not runtime.gpu_available():
        assert main(["tune", "matmul_tc", "--shape", "256,256,128"]) == 1
        assert "measures on a Hopper GPU" in capsys.readouterr().err


def test_a_tune_folder_that_is_a_file_or_an_oversized_entry_is_a_warning(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv("CBRULES_TUNE_DIR", str(blocker))
    calls = []
    with pytest.warns(TuneCacheWarning, match="cannot create"):
        choice, _ = _tune(calls)
    assert choice.config == {"width": 512} and blocker.read_text() == "x"
    folder = tmp_path / "tune2"
    monkeypatch.setenv("CBRULES_TUNE_DIR", str(folder))
    _tune(calls)
    (path,) = folder.iterdir()
    path.write_bytes(b"{" + b" " * (2 << 20) + b"}")  # past the size of any entry: read as damaged
    calls.clear()
    with pytest.warns(TuneCacheWarning, match="damaged"):
        again, _ = _tune(calls)
    assert not again.cached and len(calls) == 3
