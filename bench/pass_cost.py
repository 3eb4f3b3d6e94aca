"""Cost of one target / draft forward pass on CPU, per dtype, kernel and thread count.

Speculative decoding pays only when a k-token pass of the target costs about as
much as a 1-token pass. This benchmark loads the offline pair
(``mtad.models.offline.load_offline``), prefills a ~300-token prefix of real code
once per variant, then times single forward passes of k = 1, 2, 4, 5, 8 new
tokens on that cache (cropping the cache back after each pass). Variants of one
model are measured interleaved — every repetition runs every (k, variant) once,
in a shuffled order — so that load from other processes hits all of them alike.
It prints the median ms per pass and the k-token / 1-token ratio.

With ``--accuracy`` it also compares each variant's logits with float32 +
``default`` on 64 tokens of the same text fed 8 at a time (the k-token path): max
and mean absolute logit difference and argmax agreement.

``--micro`` times single float32 linear layers of the target's shapes instead (median over
repetitions), to pick ``kernels.WXT_MAX_ROWS``.

Examples::

    python bench/pass_cost.py --quick
    python bench/pass_cost.py --accuracy --threads 1 2
    python bench/pass_cost.py --models draft --variants float32:wxt bfloat16:default
"""

from __future__ import annotations

import argparse
import gc
import inspect
import os
import platform
import random
import statistics
import sys
import textwrap
import time

import torch

if __package__ in (None, ""):  # run as `python bench/pass_cost.py` from a checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mtad.models.kernels import (
    EXACT_KERNELS,
    INT8_KERNELS,
    KERNELS,
    KernelLinear,
    apply_cpu_kernel,
    cpu_flags,
    set_kernel,
)
from mtad.models.offline import DRAFT, TARGET, load_offline

ROLES = {"target": TARGET, "draft": DRAFT}
DEFAULT_VARIANTS = (
    "float32:default", "float32:wxt", "float32:int8", "float32:int8w",
    "bfloat16:default", "bfloat16:int8w",
)
QUICK_VARIANTS = ("float32:default", "float32:wxt", "float32:int8w", "bfloat16:default")
# resident bytes per parameter for the float weights, to refuse runs that would not fit
BYTES = {"float32": 4, "bfloat16": 2}
PARAMS = {"target": 1.78e9, "draft": 0.63e9}


def cpu_summary() -> str:
    flags = cpu_flags()
    name = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), name)
    except OSError:
        pass
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8") if f in flags]
    return f"{name}; {os.cpu_count()} CPUs; ISA: {' '.join(isa) or '?'}; torch {torch.__version__} (capability {torch.backends.cpu.get_cpu_capability()})"


def mem_available_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("inf")


def prompt_ids(tok, n_tokens: int) -> torch.Tensor:
    """At least ``n_tokens`` token ids of real Python code (stdlib source, chat-formatted)."""
    code = inspect.getsource(textwrap)
    msgs = [{"role": "user", "content": "Explain what this module does:\n\n" + code}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
    ids = tok(text)["input_ids"]
    if len(ids) < n_tokens:
        raise RuntimeError(f"benchmark text has only {len(ids)} tokens, need {n_tokens}")
    return torch.tensor([ids[:n_tokens]])


def parse_variants(items) -> list[tuple[str, str]]:
    out = []
    for item in items:
        dtype, _, kernel = item.partition(":")
        if dtype not in BYTES or kernel not in KERNELS:
            raise SystemExit(f"bad variant {item!r}: want DTYPE:KERNEL with DTYPE in {list(BYTES)} "
                             f"and KERNEL in {list(KERNELS)}")
        out.append((dtype, kernel))
    return out


class Variant:
    """One (dtype, kernel) of one model, with its own cache of the shared prefix."""

    def __init__(self, model, dtype: str, kernel: str):
        self.model, self.dtype, self.kernel = model, dtype, kernel
        self.cache = None
        self.prefix_len = 0

    @property
    def label(self) -> str:
        return f"{self.dtype}:{self.kernel}"

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor) -> None:
        from transformers import DynamicCache

        set_kernel(self.model, self.kernel)
        from mtad.core.runner import ModelRunner
        from mtad.core.stack import checked_cache_keyword

        self.cache = DynamicCache(config=self.model.config)
        self.cache_kw = checked_cache_keyword(self.model, ModelRunner)  # never a keyword this transformers ignores
        self.model(ids, **{self.cache_kw: self.cache}, use_cache=True)
        self.prefix_len = ids.shape[1]

    @torch.no_grad()
    def step(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits of ``ids`` after the prefix; the cache is cropped back afterwards."""
        set_kernel(self.model, self.kernel)
        logits = self.model(ids, **{self.cache_kw: self.cache}, use_cache=True).logits
        extra = self.cache.get_seq_length() - self.prefix_len
        if extra:
            self.cache.crop(-extra)
        assert self.cache.get_seq_length() == self.prefix_len
        return logits


def load_variants(role: str, variants: list[tuple[str, str]]) -> list[Variant]:
    """One model copy per dtype; kernels switch on it (int8 packs shared across dtypes)."""
    models, out = {}, []
    for dtype in dict.fromkeys(d for d, _ in variants):
        t0 = time.perf_counter()
        model, tok = load_offline(ROLES[role], dtype)
        apply_cpu_kernel(model, "default")
        models[dtype] = model
        print(f"  loaded {role} {dtype} in {time.perf_counter() - t0:.1f} s", flush=True)
    int8_kinds = list(dict.fromkeys(k for _, k in variants if k in INT8_KERNELS))
    if int8_kinds:
        # quantize once, from the float32 weights when loaded, and share the packs
        t0 = time.perf_counter()
        src = models.get("float32") or next(iter(models.values()))
        for kind in int8_kinds:
            set_kernel(src, kind)
        packs = {n: (m._packed, m._w8) for n, m in src.named_modules() if isinstance(m, KernelLinear)}
        for model in models.values():
            for n, m in model.named_modules():
                if isinstance(m, KernelLinear):
                    m._packed, m._w8 = packs[n]
        set_kernel(src, "default")
        print(f"  quantized for {', '.join(int8_kinds)} in {time.perf_counter() - t0:.1f} s", flush=True)
    for dtype, kernel in variants:
        out.append(Variant(models[dtype], dtype, kernel))
    return out, tok


def time_pass(v: Variant, ids: torch.Tensor) -> float:
    t0 = time.perf_counter()
    v.step(ids)
    return (time.perf_counter() - t0) * 1e3


def bench_role(role: str, variants, args) -> list[dict]:
    print(f"\n== {role} ({ROLES[role]}) ==", flush=True)
    vs, tok = load_variants(role, variants)
    ids = prompt_ids(tok, args.prefix + max(args.ks) + 64)
    prefix, rest = ids[:, : args.prefix], ids[:, args.prefix :]
    t0 = time.perf_counter()
    for v in vs:
        v.prefill(prefix)
    print(f"  prefilled {args.prefix} tokens x {len(vs)} variants in {time.perf_counter() - t0:.1f} s",
          flush=True)
    threads = args.threads
    cells = [(v, k, th) for v in vs for k in args.ks for th in threads]
    times: dict[tuple, list[float]] = {(id(v), k, th): [] for v, k, th in cells}
    rng = random.Random(0)
    t0 = time.perf_counter()
    for rep in range(args.warmup + args.reps):
        order = cells[:]
        rng.shuffle(order)
        for v, k, th in order:
            torch.set_num_threads(th)
            ms = time_pass(v, rest[:, :k])
            if rep >= args.warmup:
                times[(id(v), k, th)].append(ms)
    torch.set_num_threads(args.default_threads)
    print(f"  timed {len(cells)} cells x {args.warmup + args.reps} reps in "
          f"{time.perf_counter() - t0:.1f} s (load average now {os.getloadavg()[0]:.2f})", flush=True)

    acc = {}
    if args.accuracy:
        acc = accuracy(vs, rest)

    rows = []
    for v in vs:
        for th in threads:
            med = {k: statistics.median(times[(id(v), k, th)]) for k in args.ks}
            rows.append(dict(role=role, variant=v.label, threads=th, ms=med, acc=acc.get(v.label)))
    del vs
    gc.collect()
    return rows


@torch.no_grad()
def accuracy(vs: list[Variant], rest: torch.Tensor, chunk: int = 8, n: int = 64) -> dict:
    """Logit error of each variant against float32 + default, on n tokens fed `chunk` at a time."""
    def run(v: Variant) -> torch.Tensor:
        set_kernel(v.model, v.kernel)
        out = [v.model(rest[:, i : i + chunk], cache=v.cache, use_cache=True).logits.float()
               for i in range(0, n, chunk)]
        v.cache.crop(-(v.cache.get_seq_length() - v.prefix_len))
        return torch.cat(out, dim=1)[0]

    ref_v = next((v for v in vs if v.dtype == "float32" and v.kernel == "default"), None)
    if ref_v is None:
        print("  (accuracy needs float32:default among the variants; skipped)")
        return {}
    ref = run(ref_v)
    res = {}
    for v in vs:
        got = ref if v is ref_v else run(v)
        diff = (got - ref).abs()
        res[v.label] = dict(
            max_abs=diff.max().item(), mean_abs=diff.mean().item(),
            argmax=(got.argmax(-1) == ref.argmax(-1)).float().mean().item(),
        )
    return res


def print_table(rows: list[dict], ks) -> None:
    head = f"{'model':7s} {'dtype:kernel':19s} {'thr':>3s} " + " ".join(f"{'k=' + str(k):>8s}" for k in ks)
    head += "   " + " ".join(f"{'r' + str(k):>5s}" for k in ks if k != 1)
    has_acc = any(r["acc"] for r in rows)
    if has_acc:
        head += f"   {'maxabs':>7s} {'meanabs':>7s} {'argmax':>6s}"
    print("\nmedian ms per forward pass (k new tokens on the cached prefix); rK = ms(k=K) / ms(k=1)")
    print(head)
    for r in rows:
        ms = r["ms"]
        line = f"{r['role']:7s} {r['variant']:19s} {r['threads']:3d} " + " ".join(f"{ms[k]:8.1f}" for k in ks)
        base = ms.get(1)
        line += "   " + " ".join(f"{ms[k] / base:5.2f}" if base else "    -" for k in ks if k != 1)
        if has_acc and r["acc"]:
            a = r["acc"]
            line += f"   {a['max_abs']:7.3f} {a['mean_abs']:7.4f} {a['argmax']:6.3f}"
        print(line)


def micro(args) -> None:
    """Median ms of one float32 linear of the target's shapes: F.linear vs the wxt kernel.

    Each timing cycles through enough distinct weight matrices (>= 1 GB) that they
    come from memory, not cache, as in a real pass.
    """

    from mtad.models.kernels import KernelLinear

    shapes = {"q/o 1536x1536": (1536, 1536), "up 8960x1536": (8960, 1536),
              "down 1536x8960": (1536, 8960), "head 151936x1536": (151936, 1536)}
    rows_list = [1, 2, 3, 4, 8, 16, 32, 64, 128]
    torch.manual_seed(0)

    def timed(mods, x) -> float:
        ts = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            for m in mods:
                m(x)
            ts.append((time.perf_counter() - t0) / len(mods))
        return statistics.median(ts) * 1e3

    for th in args.threads:
        torch.set_num_threads(th)
        print(f"\nthreads={th}: median ms per call over {args.reps} sweeps")
        for name, (o, i) in shapes.items():
            n = max(2, int(1e9 // (o * i * 4)))
            mods = []
            for _ in range(n):
                m = torch.nn.Linear(i, o, bias=False)
                m.__class__ = KernelLinear
                mods.append(m)
            for r in rows_list:
                x = torch.randn(r, i)
                t = {}
                for kind in ("default", "wxt"):
                    for m in mods:
                        m.kernel = kind
                    t["f32:" + kind] = timed(mods, x)
                t["ratio"] = t["f32:wxt"] / t["f32:default"]
                print(f"  {name:17s} rows={r:4d} " + " ".join(f"{k}={v:8.3f}" for k, v in t.items()),
                      flush=True)
            del mods
            gc.collect()
    torch.set_num_threads(args.default_threads)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", choices=list(ROLES), default=list(ROLES))
    p.add_argument("--variants", nargs="+", help=f"DTYPE:KERNEL items (default: {' '.join(DEFAULT_VARIANTS)})")
    p.add_argument("--ks", nargs="+", type=int, default=[1, 2, 4, 5, 8])
    p.add_argument("--threads", nargs="+", type=int, help="thread counts to interleave (default: current)")
    p.add_argument("--prefix", type=int, default=300)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--accuracy", action="store_true", help="also compare logits with float32:default")
    p.add_argument("--quick", action="store_true",
                   help=f"3 reps, k in 1 4 8, variants {' '.join(QUICK_VARIANTS)} unless given")
    p.add_argument("--micro", action="store_true", help="time single linear layers instead")
    p.add_argument("--force", action="store_true", help="run even if memory looks short")
    args = p.parse_args(argv)
    args.default_threads = torch.get_num_threads()
    args.threads = args.threads or [args.default_threads]
    if args.quick:
        args.reps = 3
        if args.ks == [1, 2, 4, 5, 8]:
            args.ks = [1, 4, 8]
        args.variants = args.variants or list(QUICK_VARIANTS)
    if 1 not in args.ks:
        args.ks = [1, *args.ks]
    variants = parse_variants(args.variants or DEFAULT_VARIANTS)

    print(f"cpu: {cpu_summary()}")
    print(f"threads: {args.threads} (default {args.default_threads}); load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; MemAvailable {mem_available_gib():.1f} GiB")
    if args.micro:
        micro(args)
        return 0
    rows = []
    for role in args.models:
        dtypes = {d for d, _ in variants}
        need = sum(PARAMS[role] * BYTES[d] for d in dtypes) / 2**30
        need += len({k.removesuffix("-body") for _, k in variants if k in INT8_KERNELS}) * PARAMS[role] / 2**30
        if need > mem_available_gib() - 1 and not args.force:
            print(f"{role}: needs ~{need:.1f} GiB, only {mem_available_gib():.1f} GiB available; "
                  f"skipped (--force to run anyway)", file=sys.stderr)
            continue
        rows += bench_role(role, variants, args)
    print_table(rows, args.ks)
    exact = [f"{d}:{k}" for d, k in variants if k in EXACT_KERNELS]
    print(f"(kernels equal to their dtype's default up to rounding: {', '.join(exact)}; "
          f"load average at end {os.getloadavg()[0]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
