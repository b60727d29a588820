"""Choose a kernel's build parameters by measuring them on the GPU, and remember the choice.

:func:`autotune` builds a kernel for each of a declared set of configurations (keyword parameters of a
builder: tiles, stages, warp specialization, registers, a persistent walk), compiles them in parallel
worker processes with a progress line, times each on the caller's arguments (CUDA events, the median of
many launches after a warm-up) and keeps the fastest in an on-disk cache keyed by the builder's name,
the device and the caller's shape key. The cache entry also records the generated CUDA's hash of the
chosen configuration: a later process (or a later cbrules, whose rules may generate other code) takes
the entry only where the chosen configuration still generates the same CUDA, and measures afresh
otherwise. A configuration the builder or the rules refuse by name is recorded with its reason and left
out; so is one whose launch the launcher refuses for these arguments.

The cache is one JSON file a key under ``$CBRULES_TUNE_DIR`` (default ``~/.cache/cbrules/tune``). It
holds configurations, never code; a damaged entry is a :class:`TuneCacheWarning` and a fresh measurement,
and a folder that another user owns or every user may write is not used (as the cubin cache's).
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from .errors import CbrulesError

__all__ = ["Choice", "Trial", "TuneError", "TuneCacheWarning", "autotune", "tune_dir"]

_MAX_ENTRY = 1 << 20  # a tuning entry is a few KB: a bigger file is not one of ours
_WORKER_SECONDS = 600  # one configuration's lowering and NVRTC compile


class TuneError(CbrulesError, ValueError):
    """An autotuning request that cannot be carried out (named: what, why, the fix)."""


class TuneCacheWarning(UserWarning):
    """A tuning cache entry or folder that could not be used; the configurations are measured afresh."""


@dataclass(frozen=True)
class Trial:
    """One configuration's outcome: its median seconds a launch, or why it was left out."""

    config: dict
    seconds: Optional[float] = None
    error: Optional[str] = None
    source_hash: Optional[str] = None


@dataclass
class Choice:
    """The chosen configuration, every trial (the cached ones where the choice came from the cache),
    whether it came from the cache, and the compiled kernel of the choice."""

    config: dict
    trials: list[Trial]
    cached: bool
    kernel: Any = field(default=None, repr=False)

    def table(self) -> str:
        """The trials as a text table, fastest first, the choice marked."""
        rows = sorted(self.trials, key=lambda t: (t.seconds is None, t.seconds or 0.0))
        width = max([len(_show(t.config)) for t in rows] + [13])
        lines = [f"{'configuration':<{width}}  {'ms a launch':>12}"]
        for t in rows:
            mark = "  <- chosen" if t.config == self.config else ""
            value = f"{t.seconds * 1e3:12.4f}" if t.seconds is not None else f"{'-':>12}  ({t.error})"
            lines.append(f"{_show(t.config):<{width}}  {value}{mark}")
        return "\n".join(lines)


def _show(config: Mapping) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items()) or "(defaults)"


def tune_dir() -> Path:
    """``$CBRULES_TUNE_DIR`` if set, else ``~/.cache/cbrules/tune``."""
    env = os.environ.get("CBRULES_TUNE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "cbrules" / "tune"


def _warn(message: str) -> None:
    warnings.warn(message, TuneCacheWarning, stacklevel=3)


def _jsonable(value: Any, what: str) -> Any:
    """``value`` as JSON keeps it (tuples become lists, so they are compared as JSON reads them back)."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as e:
        raise TuneError(f"autotune: {what} {value!r} is not plain data (numbers, strings, lists, dicts): {e}") from None


def _source_hash(source) -> str:
    return hashlib.sha256(source.text.encode()).hexdigest()


def _generate(build: Callable, config: dict):
    """The CUDA source of ``build(**config)``, or a named error's text (config as JSON gives it: lists
    for tuples, which the builders take back as tuples)."""
    from . import api
    return api.generate(build(**_builder_args(config)))


def _builder_args(config: Mapping) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}


def _compile_one(build: Callable, config: dict):
    """In a worker: ``(source, cubin)`` of one configuration, or ``(None, why)`` for a named refusal."""
    from .codegen.nvrtc import compile_cuda
    try:
        source = _generate(build, config)
        return source, compile_cuda(source.text, source.name)
    except (CbrulesError, TypeError) as e:  # a named refusal, or a parameter the builder does not take
        return None, f"{type(e).__name__}: {e}"


def _compile_all(build: Callable, configs: list[dict], workers: int, progress: Callable[[str], None],
                 name: str) -> list:
    """``(source, cubin)`` or ``(None, why)`` for each configuration, in order: in ``workers`` worker
    processes (``python -m cbrules.autotune --worker``: a fresh interpreter that imports the builder by
    name and never the caller's script, and holds no CUDA context), or here where the builder cannot be
    sent to one (a lambda or a local function)."""
    results: list = [None] * len(configs)
    done = 0
    payloads = None
    if workers > 1 and len(configs) > 1:
        try:
            payloads = [pickle.dumps((build, c)) for c in configs]
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            progress(f"tune {name}: compiling in this process (the builder cannot go to a worker: {e})")
    if payloads is not None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(_run_worker, data, env): i for i, data in enumerate(payloads)}
            for f in concurrent.futures.as_completed(futures):
                results[futures[f]] = f.result()
                done += 1
                progress(f"tune {name}: compiled {done}/{len(configs)}")
        return results
    for i, c in enumerate(configs):
        results[i] = _compile_one(build, c)
        done += 1
        progress(f"tune {name}: compiled {done}/{len(configs)}")
    return results


def _run_worker(payload: bytes, env: dict):
    """One configuration compiled in a worker process; a worker that fails says so in the result."""
    try:
        proc = subprocess.run([sys.executable, "-m", "cbrules.autotune", "--worker"], input=payload, env=env,
                              capture_output=True, timeout=_WORKER_SECONDS)
    except subprocess.TimeoutExpired:
        return None, f"the worker compiling it ran past {_WORKER_SECONDS} s"
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
        return None, f"the worker compiling it failed (exit {proc.returncode}): {tail[0]}"
    return pickle.loads(proc.stdout)  # written by our own worker from our own request


def _worker_main() -> int:
    """``python -m cbrules.autotune --worker``: a pickled (build, config) on stdin, the pickled result of
    :func:`_compile_one` on stdout."""
    build, config = pickle.loads(sys.stdin.buffer.read())
    out = pickle.dumps(_compile_one(build, config))
    sys.stdout.buffer.write(out)
    return 0


def _gpu_timer(compiled, args: Mapping[str, Any], reps: int, warmup: int) -> float:
    """Median seconds of one launch of ``compiled`` on ``args`` (CUDA events on the launch's stream)."""
    from .codegen import runtime
    bound = compiled.bind(**args)
    stream = runtime.launch_stream(bound.arrays.values())
    for _ in range(warmup):
        bound.launch()
    return statistics.median(runtime.time_launch(bound.launch, reps, stream=stream)) / 1e3


def _entry_path(folder: Path, name: str, device: str, key: Any) -> Path:
    digest = hashlib.sha256(json.dumps([name, device, key]).encode()).hexdigest()
    return folder / f"{digest}.json"


def _load(path: Path, name: str, device: str, key: Any) -> Optional[dict]:
    from .codegen.cache import read_regular_file, untrusted_folder
    why = untrusted_folder(path.parent)
    if why:
        _warn(f"tuning cache folder {path.parent} is {why}: not used; measuring afresh. Point CBRULES_TUNE_DIR "
              "at a folder only you can write")
        return None
    try:
        data = read_regular_file(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except Exception as e:  # a link, a FIFO, a folder, unreadable: not an entry
        _warn(f"tuning cache entry {path} cannot be read ({e}); measuring afresh")
        return None
    try:
        entry = json.loads(data[:_MAX_ENTRY].decode())
        ok = (isinstance(entry, dict) and entry.get("name") == name and entry.get("device") == device
              and entry.get("key") == key and isinstance(entry.get("config"), dict)
              and isinstance(entry.get("source_hash"), str) and isinstance(entry.get("trials"), list))
    except (ValueError, UnicodeDecodeError) as e:
        ok, entry = False, f"{type(e).__name__}: {e}"
    if not ok:
        _warn(f"tuning cache entry {path} is damaged or not for this kernel, device and key; measuring afresh")
        return None
    return entry


def _store(path: Path, entry: dict) -> None:
    from .codegen.cache import untrusted_folder
    if untrusted_folder(path.parent):
        return  # warned when it was read
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    except OSError as e:
        _warn(f"cannot create tuning cache entry {path} ({e.strerror or e}); the choice is not kept")
        return
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f, indent=1)
        os.replace(tmp, path)  # whole or not at all
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        _warn(f"cannot write tuning cache entry {path} ({e.strerror or e}); the choice is not kept")


def _device_name() -> str:
    from .codegen import runtime
    info = runtime.device_info()
    return f"{info['name']} sm_{info['cc'][0]}{info['cc'][1]} x{info['sm_count']}"


def autotune(name: str, build: Callable[..., Any], configs: Sequence[Mapping[str, Any]], key: Any,
             args: Mapping[str, Any], *, workers: Optional[int] = None, reps: int = 50, warmup: int = 5,
             progress: Optional[Callable[[str], None]] = None, cache: bool = True,
             timer: Optional[Callable[[Any, Mapping[str, Any]], float]] = None,
             device: Optional[str] = None) -> Choice:
    """Measure ``build(**config)`` for each of ``configs`` on ``args`` and return the fastest.

    ``name`` names the builder in the cache (one builder, one name); ``key`` (plain data: the shapes and
    dtypes the choice is for) and the device pick the entry. ``args`` are the kernel's arguments (device
    arrays are used in place: torch tensors, DeviceArrays; numpy arrays are copied for each trial).
    ``workers`` compile in that many processes (default: the CPU count, at most 8; a builder a worker
    cannot receive, such as a lambda, compiles here); ``progress`` receives one line per compiled
    configuration (default: stderr). ``cache=False`` neither reads nor writes the cache. ``timer`` and
    ``device`` replace the GPU measurement and the device's name (for tests without a GPU)."""
    if not isinstance(name, str) or not name or len(name) > 200:
        raise TuneError(f"autotune: name {name!r}: give the builder's name (a short string)")
    configs = [_jsonable(dict(c), "configuration") for c in configs]
    if not configs:
        raise TuneError(f"autotune {name}: no configurations to measure")
    if len({json.dumps(c, sort_keys=True) for c in configs}) != len(configs):
        raise TuneError(f"autotune {name}: a configuration is listed twice")
    key = _jsonable(key, "key")
    progress = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    device = device or _device_name()
    timer = timer or (lambda compiled, a: _gpu_timer(compiled, a, reps, warmup))
    path = _entry_path(tune_dir(), name, device, key)
    from .codegen.launch import CompiledKernel
    if cache:
        entry = _load(path, name, device, key)
        if entry is not None and entry["config"] in configs:
            try:
                source = _generate(build, entry["config"])
            except (CbrulesError, TypeError):
                source = None
            if source is not None and _source_hash(source) == entry["source_hash"]:
                from .codegen.nvrtc import compile_cuda
                trials = [Trial(t.get("config", {}), t.get("seconds"), t.get("error"), t.get("source_hash"))
                          for t in entry["trials"] if isinstance(t, dict)]
                kernel = CompiledKernel(source, compile_cuda(source.text, source.name))
                return Choice(entry["config"], trials, True, kernel)
            progress(f"tune {name}: the cached choice no longer generates the same CUDA; measuring afresh")
    workers = min(os.cpu_count() or 1, 8) if workers is None else workers
    compiled = _compile_all(build, configs, workers, progress, name)
    trials, kernels = [], {}
    for config, (source, result) in zip(configs, compiled):
        if source is None:
            trials.append(Trial(config, error=result))
            continue
        try:
            kernel = CompiledKernel(source, result)
            seconds = timer(kernel, args)
        except CbrulesError as e:  # the launcher refuses these arguments for this configuration
            trials.append(Trial(config, error=f"{type(e).__name__}: {e}", source_hash=_source_hash(source)))
            continue
        trials.append(Trial(config, seconds=seconds, source_hash=_source_hash(source)))
        kernels[json.dumps(config, sort_keys=True)] = kernel
        progress(f"tune {name}: {_show(config)}: {seconds * 1e3:.4f} ms")
    measured = [t for t in trials if t.seconds is not None]
    if not measured:
        raise TuneError(f"autotune {name}: no configuration ran on these arguments:\n" +
                        "\n".join(f"  {_show(t.config)}: {t.error}" for t in trials))
    best = min(measured, key=lambda t: t.seconds)
    if cache:
        _store(path, {"name": name, "device": device, "key": key, "config": best.config,
                      "source_hash": best.source_hash, "trials": [t.__dict__ for t in trials]})
    return Choice(best.config, trials, False, kernels[json.dumps(best.config, sort_keys=True)])


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    sys.exit(_worker_main())
