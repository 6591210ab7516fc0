"""The machine under the benchmark: CPU, ISA, the BLAS libraries NumPy and
PyTorch use, the environment that steers them, and the limits measured here
(FMA throughput, store bandwidth, by posenc._machine)."""

from __future__ import annotations

import ctypes
import os
import platform
import socket
import sys

import numpy as np

import posenc
from posenc import _machine     # the measuring loops, an extension apart from the engine's

# Environment variables that change what a BLAS, OpenMP or posenc does.
STEERING_PREFIXES = ("OPENBLAS_", "OMP_", "MKL_", "KMP_", "GOMP_", "POSENC_", "DNNL_", "ONEDNN_",
                     "NPY_", "ATEN_", "TORCHINDUCTOR_")
STEERING_NAMES = ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                  "MKL_NUM_THREADS", "MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE",
                  "ATEN_CPU_CAPABILITY", "POSENC_ISA")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_family() -> str:
    """The x86 family and model numbers (AMD's 25 is Zen 3/Zen 4, 26 Zen 5; model 17 a Zen 4
    EPYC), which tell machines apart where the model name does not ("AMD EPYC")."""
    found = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("cpu family", "model") and key.strip() not in found:
                    found[key.strip()] = value.strip()
                if len(found) == 2:
                    break
    except OSError:
        pass
    return (f"family {found['cpu family']}, model {found['model']}"
            if len(found) == 2 else platform.machine())


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def steering_env(environ=None) -> dict:
    """Every set variable with a steering prefix, and the key ones marked unset."""
    environ = os.environ if environ is None else environ
    found = {name: environ.get(name, "(unset)") for name in STEERING_NAMES}
    found.update({k: v for k, v in environ.items() if k.startswith(STEERING_PREFIXES)})
    return dict(sorted(found.items()))


def openblas_core() -> str | None:
    """The kernel family OpenBLAS picked at run time (its DYNAMIC_ARCH core), if NumPy uses it."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for symbol in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename",
                       "openblas_get_corename64_", "openblas_get_corename"):
            function = getattr(lib, symbol, None)
            if function is not None:
                function.restype = ctypes.c_char_p
                return function().decode()
    return None


def numpy_blas() -> dict:
    info = {"numpy": np.__version__}
    try:
        config = np.show_config(mode="dicts")
        blas = config.get("Build Dependencies", {}).get("blas", {})
        info.update(name=blas.get("name"), version=blas.get("version"),
                    configuration=blas.get("openblas configuration"),
                    simd=config.get("SIMD Extensions"))
    except Exception as exc:  # older NumPy: no mode="dicts"
        info["show_config"] = f"unavailable ({type(exc).__name__})"
    info["openblas_core_at_run_time"] = openblas_core()
    return info


def torch_blas(torch) -> dict:
    if torch is None:
        return {"torch": None}
    info = {"torch": torch.__version__, "config": torch.__config__.show().strip(),
            "parallel": torch.__config__.parallel_info().strip()}
    try:
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except Exception:
        pass
    info["blas"] = "MKL" if "BLAS_INFO=mkl" in info["config"] else (
        "OpenBLAS" if "BLAS_INFO=open" in info["config"] else "see config")
    return info


def header(torch, threads) -> dict:
    build = posenc.build_info()
    return {
        "host": socket.gethostname(),
        "cpu": cpu_model(),
        "machine": platform.machine(),
        "cores": usable_cores(),
        "python": platform.python_version(),
        "posenc": posenc.__version__,
        "posenc_isa": posenc.get_isa(),
        "posenc_isas": posenc.capabilities(),
        "posenc_build": build,
        "threads": list(threads),
        "numpy_blas": numpy_blas(),
        "torch_blas": torch_blas(torch),
        "env": steering_env(),
        "argv": sys.argv,
    }


def machine_limits(threads, *, fma_seconds: float, store_bytes: int, store_repeats: int,
                   progress=None) -> dict:
    """FMA FLOP/s per vector ISA and store bandwidth (plain and non-temporal) per thread count."""
    isas = [isa for isa in posenc.capabilities() if isa != "scalar"] or ["scalar"]
    fma, store = [], []
    for T in threads:
        for isa in isas:
            if progress:
                progress.start(f"FMA peak {isa} {T}t")
            fma.append({"isa": isa, "dtype": "float32", "threads": T,
                        "flops": _machine.measure_fma(isa, "float32", T, fma_seconds)})
            if progress:
                progress.done(1)
        for nontemporal in (1, 0):
            if progress:
                progress.start(f"store bandwidth {'streaming' if nontemporal else 'plain'} {T}t")
            rate = _machine.measure_store(posenc.get_isa(), store_bytes, T, nontemporal,
                                           store_repeats)
            store.append({"isa": posenc.get_isa(), "threads": T, "nontemporal": bool(nontemporal),
                          "bytes": store_bytes, "bytes_per_s": rate})
            if progress:
                progress.done(1)
    # More threads never lower a machine's limit: a smaller figure at more threads is
    # noise (another process on the cores), so each limit is the best at <= T threads.
    peak = {T: max(r["flops"] for r in fma if r["threads"] <= T) for T in threads}
    bandwidth = {T: max(r["bytes_per_s"] for r in store if r["threads"] <= T) for T in threads}
    return {"fma": fma, "store": store, "peak_flops": peak, "store_bandwidth": bandwidth}


def dtype_peaks(threads: int, seconds: float) -> dict:
    """The FMA peaks a fraction of peak is stated against, by dtype, at `threads`:
    float32's on the widest vector ISA this CPU runs (posenc.capabilities(): AVX-512,
    else AVX2, else NEON); bfloat16's from its dot products (VDPBF16PS) where the CPU has
    AVX512-BF16.  Without them posenc's bfloat16 kernels widen their operands and run
    float32 FMAs, so the float32 peak is bfloat16's too, and `peak_sources` says so.
    Returns {"peaks": {dtype: FLOP/s or None}, "peak_sources": {dtype: what was measured}},
    the keys of a run's JSON."""
    vector = [isa for isa in posenc.capabilities() if isa != "scalar"] or ["scalar"]
    widest = vector[-1]

    def best(dtype):   # a peak is a maximum: the best of three, past a busy stretch of the host
        return max(_machine.measure_fma(widest, dtype, threads, seconds / 3) for _ in range(3))

    f32 = best("float32")
    peaks = {"float32": f32 if f32 > 0 else None}
    sources = {"float32": f"{widest} FMA"}
    bf16 = best("bfloat16") if widest == "avx512" else -1.0
    if bf16 > 0:
        peaks["bfloat16"], sources["bfloat16"] = bf16, "avx512 VDPBF16PS"
    else:
        peaks["bfloat16"] = peaks["float32"]
        sources["bfloat16"] = (f"{widest} float32 FMA: no bfloat16 dot product on this CPU, "
                               "posenc's bfloat16 kernels run float32 FMAs")
    return {"peaks": peaks, "peak_sources": sources}


def remeasure_peaks(results: dict, threads: int, seconds: float) -> None:
    """The run's peaks measured again at its end, each the larger of the two: a peak is a
    maximum, and a neighbour's load at the start would inflate every fraction after it
    (a Zen 3 host measured 100 GFLOP/s at one run's start, 175 ten minutes before)."""
    again = dtype_peaks(threads, seconds)["peaks"]
    for dtype, rate in again.items():
        if rate and (not results["peaks"].get(dtype) or rate > results["peaks"][dtype]):
            results["peaks"][dtype] = rate


def peaks_text(results: dict) -> str:
    """'float32 222 GFLOP/s (avx512 FMA), bfloat16 ...': a run's peaks (dtype_peaks' keys)
    for its page; a run saved before peak_sources existed names no source."""
    peaks, sources = results.get("peaks") or {}, results.get("peak_sources") or {}
    return ", ".join((f"{k} {v / 1e9:.0f} GFLOP/s" if v else f"{k} not measured")
                     + (f" ({sources[k]})" if k in sources else "") for k, v in peaks.items())
