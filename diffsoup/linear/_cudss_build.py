"""Finding cuDSS and compiling diffsoup's cuDSS FFI handler (``_cudss_ffi/diffsoup_cudss.cu``).

The handler is compiled on first use of ``ds.linear.CuDSS`` into a cache directory, or ahead of
time with::

    python -m diffsoup.linear._cudss_build            # build (or find) it in the cache, print its path
    python -m diffsoup.linear._cudss_build --check    # say what was found, build nothing

What it needs, and where it looks:

* ``cudss.h`` and ``libcudss.so.1``: ``$CUDSS_ROOT`` (``include/``, ``lib/``), else the installed
  ``nvidia-cudss-cu13`` / ``nvidia-cudss-cu12`` wheel (``nvidia/cu13``, ``nvidia/cu12`` or
  ``nvidia/cudss`` under site-packages). The wheels ship ``libcudss.so.1`` and no unversioned
  ``libcudss.so``, so the handler links it by that name (``-l:libcudss.so.1``) with an rpath to
  the wheel's folder.
* ``nvcc`` (``$NVCC``, ``$CUDA_HOME/bin``, ``PATH``, ``/usr/local/cuda/bin``) with the CUDA runtime
  it ships (linked statically, the nvcc default, so no ``libcudart`` has to be found at run time);
  ``jax.ffi.include_dir()`` for XLA's FFI headers.
* The cache: ``$DIFFSOUP_CACHE_DIR/cudss-build``, else ``$XDG_CACHE_HOME/diffsoup/cudss-build``
  (``~/.cache/diffsoup/cudss-build``). Each build lives in a folder named by a hash of the
  source, the cuDSS header, nvcc's version, the FFI headers and the flags, so a changed input
  rebuilds and concurrent processes share one build (a file lock serializes them).

The same source builds against the cu12 and cu13 wheels; only cu13 (CUDA 13) was exercised on a
GPU. ``$DIFFSOUP_CUDSS_NVCC_FLAGS`` replaces the default architecture flags.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jax

from .._settings import settings

SOURCE = Path(__file__).resolve().parent / "_cudss_ffi" / "diffsoup_cudss.cu"
LIBRARY_NAME = "libdiffsoup_cudss.so"
CUDSS_SONAME = "libcudss.so.1"
# Ampere and Hopper machine code plus PTX for later chips; the handler has two tiny kernels.
DEFAULT_ARCH_FLAGS = (
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
)
HANDLER_SYMBOLS = (
    "DiffsoupCudssAnalyzeFactor",
    "DiffsoupCudssRefactor",
    "DiffsoupCudssSolve",
    "DiffsoupCudssSolveTranspose",
    "diffsoup_cudss_version",
    "diffsoup_cudss_counters",
    "diffsoup_cudss_release_all",
)


@dataclasses.dataclass(frozen=True)
class CudssInstall:
    """Where cuDSS's header and library are."""

    include_dir: Path
    lib_dir: Path

    @property
    def header(self) -> Path:
        return self.include_dir / "cudss.h"

    @property
    def library(self) -> Path:
        return self.lib_dir / CUDSS_SONAME

    @property
    def version(self) -> str:
        """``major.minor.patch`` read from ``cudss.h``."""
        parts = {}
        try:
            for line in self.header.read_text(errors="replace").splitlines():
                bits = line.split()
                if len(bits) == 3 and bits[0] == "#define" and bits[1].startswith("CUDSS_VERSION_"):
                    parts[bits[1][len("CUDSS_VERSION_"):]] = bits[2]
        except OSError:
            return "unknown"
        return ".".join(parts.get(k, "?") for k in ("MAJOR", "MINOR", "PATCH"))


def _candidate_roots():
    root = os.environ.get("CUDSS_ROOT")
    if root:
        yield Path(root)
    bases = []
    try:
        import nvidia  # namespace package of NVIDIA's wheels

        bases.extend(Path(p) for p in getattr(nvidia, "__path__", []))
    except ImportError:
        pass
    for entry in sys.path:
        if entry:
            bases.append(Path(entry) / "nvidia")
    seen = set()
    for base in bases:
        for sub in ("cu13", "cu12", "cudss"):
            path = base / sub
            if path not in seen:
                seen.add(path)
                yield path


def find_cudss(*, need_library: bool = True) -> CudssInstall | None:
    """cuDSS's header (and library) from ``$CUDSS_ROOT`` or an installed nvidia-cudss wheel."""
    for root in _candidate_roots():
        inc = root / "include"
        if not (inc / "cudss.h").is_file():
            continue
        for lib in (root / "lib", root / "lib64"):
            if (lib / CUDSS_SONAME).exists():
                return CudssInstall(inc, lib)
        if not need_library:
            return CudssInstall(inc, root / "lib")
    return None


def find_nvcc() -> Path | None:
    """The CUDA compiler: ``$NVCC``, ``$CUDA_HOME/bin``, ``PATH``, ``/usr/local/cuda/bin``."""
    candidates = [os.environ.get("NVCC")]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "bin", "nvcc"))
    candidates += [shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return Path(c)
    return None


def cache_root() -> Path:
    """``$DIFFSOUP_CACHE_DIR/cudss-build``, else ``$XDG_CACHE_HOME/diffsoup/cudss-build`` (the
    process settings' cache directory, ``diffsoup._settings``)."""
    return settings().cache_dir / "cudss-build"


def _arch_flags() -> list[str]:
    custom = settings().cudss_nvcc_flags  # DIFFSOUP_CUDSS_NVCC_FLAGS
    return list(custom) if custom else list(DEFAULT_ARCH_FLAGS)


def _nvcc_version(nvcc: Path) -> str:
    try:
        return subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _ffi_include_dir() -> Path:
    return Path(jax.ffi.include_dir())


def build_hash(cudss: CudssInstall, nvcc: Path) -> str:
    h = hashlib.sha256()
    h.update(SOURCE.read_bytes())
    h.update(cudss.header.read_bytes())
    h.update(str(cudss.lib_dir).encode())
    h.update(_nvcc_version(nvcc).encode())
    ffi_h = _ffi_include_dir() / "xla" / "ffi" / "api" / "ffi.h"
    h.update(ffi_h.read_bytes() if ffi_h.is_file() else b"")
    h.update(" ".join(_arch_flags()).encode())
    return h.hexdigest()[:16]


def compile_command(cudss: CudssInstall, nvcc: Path, output: Path) -> list[str]:
    """The nvcc command line that builds the handler into ``output``."""
    return [
        str(nvcc), "-O2", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
        "-I", str(_ffi_include_dir()), "-I", str(cudss.include_dir),
        *_arch_flags(), str(SOURCE), "-o", str(output),
        "-L", str(cudss.lib_dir), "-Xlinker", f"-l:{CUDSS_SONAME}",
        "-Xlinker", f"-rpath,{cudss.lib_dir}",
    ]  # fmt: skip


class BuildError(RuntimeError):
    """The handler could not be compiled (the message says why and shows the command)."""


@contextlib.contextmanager
def _file_lock(path: Path):
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def cached_library() -> Path | None:
    """The built handler for the cuDSS and nvcc found now, if it is in the cache already."""
    cudss, nvcc = find_cudss(), find_nvcc()
    if cudss is None or nvcc is None:
        # Without nvcc, any build for this cuDSS in the cache will do (built ahead of time).
        if cudss is None or not cache_root().is_dir():
            return None
        for lib in sorted(cache_root().glob(f"*/{LIBRARY_NAME}")):
            stamp = lib.with_name("cudss-lib-dir")
            if stamp.is_file() and stamp.read_text().strip() == str(cudss.lib_dir):
                return lib
        return None
    lib = cache_root() / build_hash(cudss, nvcc) / LIBRARY_NAME
    return lib if lib.is_file() else None


def build(out_dir: str | os.PathLike | None = None, *, force: bool = False, verbose: bool = False,
          need_library: bool = True) -> Path:  # fmt: skip
    """Compile the handler (or find it in the cache) and return the shared library's path.

    Args:
        out_dir: build into this folder instead of the cache.
        force: rebuild even if the library exists.
        verbose: print the command.
        need_library: if False, compile against the header alone when ``libcudss.so.1`` is
            missing (an object file then: ``-c``; used to check that the source compiles).

    Raises:
        BuildError: cuDSS or nvcc missing, or the compiler failed.
    """
    cudss = find_cudss(need_library=need_library)
    if cudss is None:
        raise BuildError(
            "cuDSS was not found: install the nvidia-cudss-cu13 (or -cu12) wheel, e.g. "
            "pip install 'diffsoup[cuda13]', or point CUDSS_ROOT at a folder with include/cudss.h "
            "and lib/libcudss.so.1."
        )
    nvcc = find_nvcc()
    if nvcc is None:
        raise BuildError(
            "nvcc (the CUDA compiler) was not found: install the CUDA toolkit, or set NVCC / CUDA_HOME; "
            "or build the handler ahead of time on a machine that has it "
            "(python -m diffsoup.linear._cudss_build) into the same DIFFSOUP_CACHE_DIR."
        )
    folder = Path(out_dir) if out_dir is not None else cache_root() / build_hash(cudss, nvcc)
    target = folder / LIBRARY_NAME
    if target.is_file() and not force:
        return target
    with _file_lock(folder / ".lock"):
        if target.is_file() and not force:
            return target
        with tempfile.TemporaryDirectory(dir=folder, prefix=".tmp-") as tmp:
            out = Path(tmp) / LIBRARY_NAME
            cmd = compile_command(cudss, nvcc, out)
            if not cudss.library.exists():  # header-only check: compile, don't link
                cmd = [c for c in cmd[: cmd.index("-L")]]
                cmd = [c for c in cmd if c != "-shared"] + ["-c"]
            if verbose:
                print(" ".join(cmd), file=sys.stderr)
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise BuildError(
                    "compiling diffsoup's cuDSS handler failed:\n  " + " ".join(cmd) + "\n" + proc.stdout + proc.stderr
                )
            os.replace(out, target)
        (folder / "cudss-lib-dir").write_text(str(cudss.lib_dir))
    return target


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m diffsoup.linear._cudss_build",
        description="Build diffsoup's cuDSS FFI handler ahead of time (into the cache, or --out).",
    )
    parser.add_argument("--out", help="build into this folder instead of the cache")
    parser.add_argument("--force", action="store_true", help="rebuild even if a build exists")
    parser.add_argument("--check", action="store_true", help="only report what was found")
    args = parser.parse_args(argv)
    cudss, nvcc = find_cudss(), find_nvcc()
    print(f"cuDSS: {cudss.include_dir if cudss else 'not found'}" + (f" (version {cudss.version})" if cudss else ""))
    print(f"nvcc: {nvcc or 'not found'}")
    print(f"cache: {cache_root()}")
    if args.check:
        lib = cached_library()
        print(f"built: {lib or 'no'}")
        return 0 if cudss and (nvcc or lib) else 1
    try:
        path = build(args.out, force=args.force, verbose=True)
    except BuildError as err:
        print(err, file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
