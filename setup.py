"""Build of posenc._C (the engine) and posenc._machine (the benchmarks'
measuring loops).

The engine, dispatch and bindings are compiled at the target's baseline; each
per-ISA file is compiled on its own with its own flags, so a wheel built
here imports on any x86-64 and picks its kernels at run time.
No -march=native anywhere.

Environment:
  POSENC_SANITIZE=1   build with -fsanitize=address,undefined (see .ci/run)
  POSENC_NO_OPENMP=1  build without OpenMP
"""

import glob
import os
import platform
import sys

import numpy as np
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError

MACHINE = platform.machine().lower()
X86 = MACHINE in ("x86_64", "amd64", "i686", "i386")
ARM64 = MACHINE in ("aarch64", "arm64")

AVX512_FLAGS = ["-mavx512f", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma"]

# isa: (flags, define when compiled, platforms)
ISAS = {
    "scalar": ([], None, True),
    "avx2": (["-mavx2", "-mfma", "-mf16c"], "POSENC_HAVE_AVX2", X86),
    "avx512": (AVX512_FLAGS, "POSENC_HAVE_AVX512", X86),
    "neon": ([], "POSENC_HAVE_NEON", ARM64),
}

# Extensions of an ISA (csrc/isa/<name>.c in the engine, csrc/machine/<name>.c
# in the benchmarks' probes), built where the compiler takes their flags:
# without them the ISA's own kernels serve.
ISA_EXTENSIONS = {
    "avx512bf16": (AVX512_FLAGS + ["-mavx512bw", "-mavx512bf16"], "POSENC_HAVE_AVX512BF16", X86),
}

COMMON_FLAGS = ["-O3", "-std=c11", "-Wall", "-Wextra", "-fno-strict-aliasing",
                "-Wno-unused-parameter", "-Wno-missing-field-initializers"]
SANITIZE = os.environ.get("POSENC_SANITIZE") == "1"
OPENMP = os.environ.get("POSENC_NO_OPENMP") != "1" and sys.platform != "win32"
if SANITIZE:
    COMMON_FLAGS = ["-O1", "-g", "-std=c11", "-fsanitize=address,undefined",
                    "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]


class BuildExt(build_ext):
    """Compiles each per-ISA file of an extension (csrc/<isa_dir>/<isa>.c)
    with its ISA's flags into that extension."""

    def build_extension(self, ext):
        objects = []
        defines = list(ext.define_macros)
        for isa, (flags, define, enabled) in ext.isas.items():
            if not enabled:
                continue
            try:
                objects += self.compiler.compile(
                    [f"csrc/{ext.isa_dir}/{isa}.c"], output_dir=self.build_temp,
                    include_dirs=ext.include_dirs, extra_postargs=COMMON_FLAGS + flags,
                    depends=ext.depends)
            except CompileError:
                if isa in ISAS:
                    raise
                print(f"posenc: {isa} not built (the compiler refuses {' '.join(flags)})",
                      file=sys.stderr)
                continue
            if define:
                defines.append((define, "1"))
        ext.extra_objects = objects
        ext.define_macros = defines
        super().build_extension(ext)


if not OPENMP:
    openmp_flags, openmp_link = [], []
elif sys.platform == "darwin":
    # Apple clang has no -fopenmp driver flag: the pragmas through the preprocessor and
    # LLVM's libomp (Homebrew's; CPPFLAGS/LDFLAGS point at it, delocate bundles it:
    # [tool.cibuildwheel.macos] in pyproject.toml)
    openmp_flags, openmp_link = ["-Xpreprocessor", "-fopenmp"], ["-lomp"]
else:
    openmp_flags = openmp_link = ["-fopenmp"]
link_flags = list(openmp_link)
if SANITIZE:
    link_flags += ["-fsanitize=address,undefined"]


def extension(name, sources, isa_dir, isas=ISAS):
    ext = Extension(
        name, sources=sources,
        include_dirs=[np.get_include(), "csrc"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_2_0_API_VERSION")],
        extra_compile_args=COMMON_FLAGS + openmp_flags,
        extra_link_args=link_flags,
        # every C file: a change to an ISA object must relink the extension too
        depends=sorted(glob.glob("csrc/**/*.[ch]", recursive=True)),
    )
    ext.isa_dir = isa_dir
    ext.isas = isas
    return ext


ENGINE = ["csrc/engine/" + name for name in (
    "entry.c", "terms.c", "engine_f32.c", "engine_f64.c", "engine_lp.c", "bf16dot.c", "runs.c",
    "spans.c", "alloc.c", "threads.c", "philox.c")]

setup(
    ext_modules=[
        extension("posenc._C", ["csrc/module.c", "csrc/dispatch.c", "csrc/cpu.c"] + ENGINE, "isa",
                  {**ISAS, **ISA_EXTENSIONS}),
        extension("posenc._machine", ["csrc/machine/module.c", "csrc/machine/measure.c",
                                      "csrc/cpu.c"], "machine", {**ISAS, **ISA_EXTENSIONS}),
    ],
    cmdclass={"build_ext": BuildExt},
)
