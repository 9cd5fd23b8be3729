"""NVIDIA cuDSS on GPUs through XLA FFI handlers of our own: ``ds.linear.CuDSS``.

Constructing ``CuDSS(...)`` is plain configuration and works anywhere; importing this module
loads nothing. ``prepare`` (what ``spec.build`` calls) checks that cuDSS can run — a CUDA GPU
visible to JAX, the cuDSS library of the ``nvidia-cudss-cu13`` (or ``-cu12``) wheel, and the
handler built or buildable with nvcc — compiles the handler on first use into the cache
(``diffsoup.linear._cudss_build``; ahead of time: ``python -m diffsoup.linear._cudss_build``),
registers its targets with XLA, and raises a ``RuntimeError`` saying what is missing otherwise.

How the solver maps onto cuDSS (``_cudss_ffi/diffsoup_cudss.cu`` holds the C++ side):

* ``begin`` runs cuDSS's analysis (reordering and symbolic factorization) on the pattern, once
  per process and key (device, pattern, dtype, batch size, slot, settings): the C++ registry
  keeps it. It then factors placeholder values (the identity). ``end`` releases nothing: the
  registry keeps the factors' memory for the next solve on the same pattern;
  :func:`release_cudss_memory` frees it all.
* ``factor`` is one cuDSS refactorization per step on the analysis; ``solve`` one cuDSS solve;
  transposed solves (the adjoint) use cuDSS 1.0's ``CUDSS_CONFIG_SOLVE_MODE`` (with a checked
  fallback that factors ``A^T`` where a configuration refuses it).
* ``vmap`` over the matrix values becomes one cuDSS *uniform batch* (``CUDSS_CONFIG_UBATCH_SIZE``);
  ``vmap`` over right-hand sides alone (forward sensitivities) becomes one multi-RHS solve.
* Precision: slot ``"fp64"`` factors the values in their dtype; slot ``"low"`` factors
  float32-rounded values in float32 (real float32 factors, half the memory and bandwidth); the
  modes ``"fp32_ir"`` and ``"adaptive"`` refine on top of them as for every backend.
* Failures are values: cuDSS's error indicator (``CUDSS_DATA_INFO``) and its count of perturbed
  pivots (a singular matrix) are read after each factorization; either, non-finite values, or a
  failed cuDSS call turn the solutions of that system into NaN, which the integrator reports.
  Reading the indicator synchronizes the stream once per factorization;
  ``DIFFSOUP_CUDSS_CHECK_INFO=0`` skips it (failures then show only as non-finite solutions).
* Reproducibility: cuDSS runs in its deterministic mode (``CUDSS_CONFIG_DETERMINISTIC_MODE``),
  because the checkpointed adjoint replays forward steps and requires them to retrace the forward
  pass (otherwise it reports NaN gradients). Uniform batches still differ in the last bits from
  call to call on an H200, which the replay check allows
  (``diffsoup.integrate._checkpoint.replay_landed``); ``DIFFSOUP_CUDSS_DETERMINISTIC=0`` turns it
  off where only forward solves are needed. Where cuDSS refuses it for a configuration, that
  configuration runs without it (counted in :func:`cudss_counters` as ``determinism_off``).

Settings: ``reorder="amd"`` keeps cuDSS's own default ordering, ``"metis"`` selects its nested
dissection (METIS); ``hybrid_memory=True`` lets cuDSS keep factors in host memory, with
``hybrid_device_memory_limit_mb`` capping its device part. A ``CuDSS`` field left at ``None``
takes the ``ds.Layout``'s value (``prepare(..., layout=)``).

Memory: cuDSS allocates its factors with ``cudaMalloc``, outside XLA's pool. diffsoup's process
settings (``diffsoup._settings.configure``, run when diffsoup is imported, before JAX starts its
backends) turn JAX's preallocation off and cap its pool at ``XLA_PYTHON_CLIENT_MEM_FRACTION`` =
``diffsoup._settings.XLA_MEM_FRACTION`` (0.75) of the GPU, each only when unset; cuDSS has the
rest (about 35 GB on a 141 GB H200). For factors larger than that, lower the fraction (set the
variable before the process starts JAX) or use ``hybrid_memory``.

Only the cu13 build (CUDA 13) was exercised on a GPU; the source is the same for cu12.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import glob
import os
import sys
import threading
from typing import Any, NamedTuple, final

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

from .._settings import settings as process_settings
from ._base import AbstractLinearSolver, AbstractPreparedSolver
from .._layout import Layout

REORDERINGS = {"amd": 0, "metis": 1}
SLOTS = {"fp64": 0, "low": 1}
INFO_PERTURBED_PIVOTS = 1 << 30

_TARGETS = {
    "diffsoup_cudss_analyze_factor": "DiffsoupCudssAnalyzeFactor",
    "diffsoup_cudss_refactor": "DiffsoupCudssRefactor",
    "diffsoup_cudss_solve": "DiffsoupCudssSolve",
    "diffsoup_cudss_solve_transpose": "DiffsoupCudssSolveTranspose",
}
COUNTER_NAMES = (
    "states", "analyses", "factorizations", "refactorizations", "solves",
    "transpose_native", "transpose_fallback", "failed_calls", "info_syncs", "determinism_off",
)  # fmt: skip


@final
@dataclasses.dataclass(frozen=True)
class CuDSS(AbstractLinearSolver):
    """NVIDIA cuDSS sparse direct solver on a CUDA GPU (float32 and float64 factors).

    Args:
        reorder: ``"amd"`` (cuDSS's own default ordering) or ``"metis"`` (nested dissection);
            None takes the layout's.
        hybrid_memory: keep part of the factors in host memory; None takes the layout's.
        hybrid_device_memory_limit_mb: device memory cap (MB) of the hybrid mode; None takes the
            layout's (cuDSS's own choice when that is None too).
        ir_tol: refinement target (see :class:`~diffsoup.linear.LinearSolver`; keyword only).
        ir_max_steps: most refinement steps per solve (keyword only).

    Raises:
        ValueError: for an unknown ``reorder``, a non-bool ``hybrid_memory``, a non-positive limit,
            or a limit with ``hybrid_memory=False``.
    """

    reorder: str | None = None
    hybrid_memory: bool | None = None
    hybrid_device_memory_limit_mb: int | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.reorder is not None and self.reorder not in REORDERINGS:
            raise ValueError(f"CuDSS.reorder={self.reorder!r} must be None, 'amd' or 'metis'.")
        if self.hybrid_memory is not None and not isinstance(self.hybrid_memory, bool):
            raise ValueError(f"CuDSS.hybrid_memory must be None, True or False, not {self.hybrid_memory!r}.")
        limit = self.hybrid_device_memory_limit_mb
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit <= 0:
                raise ValueError(
                    f"CuDSS.hybrid_device_memory_limit_mb={limit!r} must be None or a positive integer number of MB."
                )
            if self.hybrid_memory is False:
                raise ValueError(
                    "CuDSS.hybrid_device_memory_limit_mb caps the device memory of cuDSS's hybrid mode; "
                    "set hybrid_memory=True with it (or leave it None to defer to the layout)."
                )

    def settings(self, layout=None) -> dict:
        """The settings in force: this object's, with ``None`` fields taken from ``layout``.

        Raises:
            ValueError: if the result has a device memory limit without hybrid memory.
        """
        if layout is None:
            layout = Layout()
        reorder = self.reorder if self.reorder is not None else layout.reorder
        hybrid = self.hybrid_memory if self.hybrid_memory is not None else bool(layout.hybrid_memory)
        limit = self.hybrid_device_memory_limit_mb
        if limit is None and hybrid:
            limit = layout.hybrid_device_memory_limit_mb  # (the layout's limit goes with its hybrid mode)
        if limit is not None and not hybrid:
            raise ValueError(
                f"CuDSS: a hybrid device memory limit ({limit} MB) is set but hybrid memory is off; "
                "set hybrid_memory=True on the CuDSS object or the layout."
            )
        return {"reorder": reorder, "hybrid_memory": hybrid, "hybrid_device_memory_limit_mb": limit}

    def prepare(self, pattern, precision, *, layout=None) -> "PreparedCuDSS":
        """Bind to a pattern: load (building on first use) the handler; analysis runs at ``begin``.

        Raises:
            RuntimeError: where cuDSS cannot run (no GPU, no cuDSS library, no handler and no nvcc),
                saying what is missing.
            ValueError: for a layout with a ``"model"`` axis over several devices (multi-GPU
                factorization is not implemented).
        """
        settings = self.settings(layout)
        if layout is not None:
            layout.check_one_device_factorization("ds.linear.CuDSS")
        reason = cudss_unavailable_reason()
        if reason is not None:
            raise RuntimeError(
                f"ds.linear.CuDSS cannot run here: {reason}. On a CPU use ds.linear.KLU() or ds.linear.Dense()."
            )
        load_binding()
        return PreparedCuDSS(self, pattern, precision, settings)


# ----------------------------------------------------------------------------------------------
# Availability and loading (nothing runs at import)
# ----------------------------------------------------------------------------------------------

_lock = threading.Lock()
_lib = None  # the loaded handler library (ctypes.CDLL), once load_binding() ran


def _gpu_present() -> bool:
    try:
        return len(jax.devices("gpu")) > 0
    except RuntimeError:
        return False


def _preload_cuda_libraries(cudss_lib_dir) -> None:
    """Load cuDSS's own dependencies (cuBLAS, NVRTC of the NVIDIA wheels), then cuDSS, globally.

    The wheels put them in ``nvidia/cu13/lib`` (or ``cu12``) of possibly different site-packages;
    libraries already loaded (JAX's CUDA plugin loads cuBLAS) are reused by their soname.
    """
    dirs = [str(cudss_lib_dir)]
    try:
        import nvidia

        roots = list(getattr(nvidia, "__path__", []))
    except ImportError:
        roots = []
    roots += [os.path.join(p, "nvidia") for p in sys.path if p]
    for root in dict.fromkeys(roots):
        for sub in ("cu13/lib", "cu12/lib", "cublas/lib", "cuda_nvrtc/lib"):
            d = os.path.join(root, sub)
            if os.path.isdir(d) and d not in dirs:
                dirs.append(d)
    for pattern in ("libcublasLt.so.*", "libcublas.so.*", "libnvrtc.so.*"):
        for d in dirs:
            found = sorted(f for f in glob.glob(os.path.join(d, pattern)) if "alt" not in os.path.basename(f))
            if found:
                try:
                    ctypes.CDLL(found[0], mode=ctypes.RTLD_GLOBAL)
                    break
                except OSError:
                    continue
    ctypes.CDLL(os.path.join(str(cudss_lib_dir), "libcudss.so.1"), mode=ctypes.RTLD_GLOBAL)


@functools.cache
def cudss_unavailable_reason() -> str | None:
    """Why ``CuDSS`` cannot run in this process, or None if it can (cached)."""
    from . import _cudss_build as build  # the GPU binding: loaded only when asked for

    if not _gpu_present():
        return "JAX sees no CUDA GPU (jax.devices('gpu') is empty; install jax[cuda13] on a GPU machine)"
    cudss = build.find_cudss()
    if cudss is None:
        return (
            "the cuDSS library (libcudss.so.1 of the nvidia-cudss-cu13 or -cu12 wheel) was not found; "
            "pip install 'diffsoup[cuda13]', or set CUDSS_ROOT"
        )
    try:
        _preload_cuda_libraries(cudss.lib_dir)
    except OSError as err:
        return f"the cuDSS library at {cudss.library} could not be loaded ({err})"
    if build.find_nvcc() is None and build.cached_library() is None:
        return (
            "the cuDSS handler is not built and nvcc (the CUDA compiler) was not found; install the CUDA "
            "toolkit or build it ahead of time with python -m diffsoup.linear._cudss_build"
        )
    return None


def has_cudss() -> bool:
    """Whether ``ds.linear.CuDSS`` can run here: a CUDA GPU, cuDSS loadable, the handler buildable."""
    return cudss_unavailable_reason() is None


def load_binding():
    """Build (first use) and load the handler library and register its FFI targets with XLA."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        from . import _cudss_build as build  # the GPU binding: loaded only when asked for

        cudss = build.find_cudss()
        if cudss is None:
            raise RuntimeError("ds.linear.CuDSS: cuDSS was not found (pip install 'diffsoup[cuda13]').")
        os.environ.setdefault("CUDSS_JIT_CACHE_DIR", str(build.cache_root().parent / "cudss-jit"))
        _preload_cuda_libraries(cudss.lib_dir)
        path = build.cached_library() or build.build()
        lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        for target, symbol in _TARGETS.items():
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="CUDA")
        lib.diffsoup_cudss_version.restype = ctypes.c_int
        lib.diffsoup_cudss_counters.restype = ctypes.c_int
        lib.diffsoup_cudss_counters.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int]
        lib.diffsoup_cudss_release_all.restype = ctypes.c_int
        _lib = lib
        return lib


def cudss_version() -> str:
    """The loaded cuDSS library's version, ``major.minor.patch``."""
    v = load_binding().diffsoup_cudss_version()
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"


def cudss_counters() -> dict[str, int]:
    """Process-wide counters of the handler (analyses, factorizations, solves, ...), for tests."""
    lib = load_binding()
    buf = (ctypes.c_int64 * len(COUNTER_NAMES))()
    lib.diffsoup_cudss_counters(buf, len(COUNTER_NAMES))
    return dict(zip(COUNTER_NAMES, (int(v) for v in buf)))


def release_cudss_memory() -> int:
    """Free every cuDSS analysis and factorization of this process (the next solve redoes them).

    Call it only while no computation that uses them is running; returns how many were freed.
    """
    if _lib is None:
        return 0
    return int(_lib.diffsoup_cudss_release_all())


# ----------------------------------------------------------------------------------------------
# Primitives (no autodiff rules: the integrator's solves have their own JVP and transpose)
# ----------------------------------------------------------------------------------------------


class Options(NamedTuple):
    """Static attributes of every handler call: they pick the registry entry and its settings."""

    pattern: int  # signed 64-bit pattern hash
    slot: int  # 0: values as given, 1: float32 factors of the "low" slot
    reorder: int  # 0: cuDSS default, 1: nested dissection
    hybrid: int
    hybrid_limit_mb: int
    check: bool  # read cuDSS's error indicator after each factorization


def _attrs(o: Options) -> dict:
    return {
        "pattern": np.int64(o.pattern), "slot": np.int32(o.slot), "reorder": np.int32(o.reorder),
        "hybrid": np.int32(o.hybrid), "hybrid_limit_mb": np.int64(o.hybrid_limit_mb), "check": bool(o.check),
    }  # fmt: skip


cudss_factor_p = Primitive("diffsoup_cudss_factor")  # (indptr, indices, values[L, nnz], after) -> info[L]
cudss_solve_p = Primitive("diffsoup_cudss_solve")  # (info[L], indptr, indices, values[L, nnz], b[L, k, n], [indptr_t, indices_t, perm_t]) -> x[L, k, n]

_I32 = np.dtype(np.int32)
cudss_factor_p.def_abstract_eval(
    lambda indptr, indices, values, after, *, opts, first: jax.core.ShapedArray(values.shape[:1], _I32)
)
cudss_solve_p.def_abstract_eval(lambda *args, opts, transpose: jax.core.ShapedArray(args[4].shape, args[4].dtype))

for _prim in (cudss_factor_p, cudss_solve_p):
    # Eager use compiles the single primitive, like any jax.numpy call.
    _prim.def_impl(functools.partial(lambda prim, *args, **params: jax.jit(functools.partial(prim.bind, **params))(*args), _prim))


def _factor_lowering(ctx, indptr, indices, values, after, *, opts, first):
    target = "diffsoup_cudss_analyze_factor" if first else "diffsoup_cudss_refactor"
    return jax.ffi.ffi_lowering(target, has_side_effect=True)(ctx, indptr, indices, values, after, **_attrs(opts))


def _solve_lowering(ctx, *args, opts, transpose):
    target = "diffsoup_cudss_solve_transpose" if transpose else "diffsoup_cudss_solve"
    return jax.ffi.ffi_lowering(target, has_side_effect=True)(ctx, *args, **_attrs(opts))


mlir.register_lowering(cudss_factor_p, _factor_lowering, platform="cuda")
mlir.register_lowering(cudss_solve_p, _solve_lowering, platform="cuda")


_NOT_MAPPED = None  # how JAX marks an unbatched operand in a batching rule


def _merge(x, bdim, size):
    """Move the vmap dimension to the front and merge it into the leading (batch) dimension."""
    x = jnp.moveaxis(x, bdim, 0)
    return x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])


def _one_pattern(x, bdim):
    """The pattern (``indptr``, ``indices``, the transpose's arrays) of a batched call, unbatched.

    The handler's registry entry is keyed by ``opts.pattern``: one prepared solver has one
    pattern, so these arrays are batched only as copies (a ``lax.cond`` whose predicate is
    batched, as the step-size control's under ``vmap``, broadcasts every operand of its
    branches; a loop whose carry holds them batches them with the carry).
    """
    return x if bdim is _NOT_MAPPED else jnp.take(x, 0, axis=bdim)


def _factor_batch(args, dims, *, opts, first):
    indptr, indices, values, after = args
    indptr, indices = _one_pattern(indptr, dims[0]), _one_pattern(indices, dims[1])
    if dims[2] is _NOT_MAPPED:  # only the ordering token is batched
        return cudss_factor_p.bind(indptr, indices, values, after, opts=opts, first=first), _NOT_MAPPED
    size = values.shape[dims[2]]
    info = cudss_factor_p.bind(indptr, indices, _merge(values, dims[2], size), after, opts=opts, first=first)
    return info.reshape(size, -1), 0


def _solve_batch(args, dims, *, opts, transpose):
    info, indptr, indices, values, b = args[:5]
    indptr, indices = _one_pattern(indptr, dims[1]), _one_pattern(indices, dims[2])
    tpattern = tuple(_one_pattern(a, d) for a, d in zip(args[5:], dims[5:]))
    di, dv, db = dims[0], dims[3], dims[4]
    if di is _NOT_MAPPED and dv is _NOT_MAPPED:
        # One factorization, many right-hand sides: one multi-RHS solve.
        bb = jnp.moveaxis(b, db, 1)  # (L, B, k, n)
        L, B, k, n = bb.shape
        x = cudss_solve_p.bind(info, indptr, indices, values, bb.reshape(L, B * k, n), *tpattern, opts=opts, transpose=transpose)
        return x.reshape(L, B, k, n), 1
    size = values.shape[dv] if dv is not _NOT_MAPPED else info.shape[di]
    info_m = _merge(info, di, size) if di is not _NOT_MAPPED else jnp.tile(info, size)
    values_m = _merge(values, dv, size) if dv is not _NOT_MAPPED else jnp.tile(values, (size, 1))
    b_m = _merge(b, db, size) if db is not _NOT_MAPPED else jnp.tile(b, (size, 1, 1))
    x = cudss_solve_p.bind(info_m, indptr, indices, values_m, b_m, *tpattern, opts=opts, transpose=transpose)
    return x.reshape((size, -1) + x.shape[1:]), 0


batching.primitive_batchers[cudss_factor_p] = _factor_batch
batching.primitive_batchers[cudss_solve_p] = _solve_batch


def factor(indptr, indices, values, after, opts: Options, *, first: bool):
    """Factor one matrix (``values`` on the CSR pattern; vmap makes it a uniform batch).

    ``first=True`` runs the analysis if the registry has none for this key, then a factorization;
    otherwise a refactorization. ``after`` is any array the call must follow (or None).
    Returns the int32 info code, shape ``(1,)`` (0 on success).
    """
    after = jnp.zeros((), jnp.int32) if after is None else after
    return cudss_factor_p.bind(indptr, indices, values[None], after, opts=opts, first=bool(first))


def solve(info, indptr, indices, values, b, opts: Options, tpattern=None):
    """``x = A^{-1} b`` (or ``A^{-T} b`` when ``tpattern`` = the transposed CSR structure and value
    permutation is given) with the factorization ``info`` came from; ``b`` is ``(n,)`` or ``(n, k)``."""
    vector = b.ndim == 1
    bm = b[:, None] if vector else b
    bb = bm.T.astype(values.dtype)[None]  # (1, k, n): each right-hand side contiguous
    extra = tuple(tpattern) if tpattern is not None else ()
    x = cudss_solve_p.bind(info, indptr, indices, values[None], bb, *extra, opts=opts, transpose=tpattern is not None)
    x = x[0].T
    return x[:, 0] if vector else x


# ----------------------------------------------------------------------------------------------
# The prepared solver
# ----------------------------------------------------------------------------------------------


def _signed64(hex_digest: str) -> int:
    h = int(hex_digest[:16], 16)
    return h - (1 << 64) if h >= (1 << 63) else h


def transposed_csr(pattern):
    """CSR structure of the transposed pattern, and the permutation taking values to it."""
    import scipy.sparse as sp

    nnz = pattern.nnz
    m = sp.csr_matrix(
        (np.arange(1, nnz + 1, dtype=np.int64), pattern.indices, pattern.indptr), shape=(pattern.n, pattern.n)
    )
    t = m.T.tocsr()
    t.sort_indices()
    return np.asarray(t.indptr, np.int32), np.asarray(t.indices, np.int32), np.asarray(t.data - 1, np.int32)


class CuDSSFactors(NamedTuple):
    """A factorization in the handler's registry: its info code (also the ordering token of the
    solves that use it), the values it factored (in the slot's dtype) and whether it succeeded."""

    info: Any
    values: Any
    ok: Any


@final
class PreparedCuDSS(AbstractPreparedSolver):
    def __init__(self, solver, pattern, precision, settings):
        super().__init__(solver, pattern, precision)
        self.settings = settings
        self.indptr = jnp.asarray(pattern.indptr, jnp.int32)
        self.indices = jnp.asarray(pattern.indices, jnp.int32)
        self.tpattern = tuple(jnp.asarray(a) for a in transposed_csr(pattern))
        self.diag_mask = np.asarray(pattern.rows == pattern.indices)
        limit = settings["hybrid_device_memory_limit_mb"]
        check_info = process_settings().cudss_check_info  # DIFFSOUP_CUDSS_CHECK_INFO
        self._opts = {
            slot: Options(
                _signed64(pattern.fingerprint), code, REORDERINGS[settings["reorder"]],
                int(bool(settings["hybrid_memory"])), int(limit or 0), check_info,
            )  # fmt: skip
            for slot, code in SLOTS.items()
        }

    def _identity_like(self, values, dtype):
        # Batched as `values` are under vmap, but always the identity (finite, never singular).
        zero = 0.0 * jnp.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)
        return jnp.where(self.diag_mask, 1.0, zero).astype(dtype)

    @staticmethod
    def _slot_values(values, slot):
        return values.astype(jnp.float32) if slot == "low" else values

    def _raw_begin(self, values, slot):
        eye = self._identity_like(values, self._slot_values(values, slot).dtype)
        return factor(self.indptr, self.indices, eye, None, self._opts[slot], first=True)

    def _raw_end(self, workspace, after):
        # The registry keeps the analysis and factors for the next solve on this pattern.
        return jnp.zeros((), jnp.int32)

    def _raw_factor(self, workspace, values, slot):
        v = self._slot_values(values, slot)
        finite = jnp.all(jnp.isfinite(v))
        v = jnp.where(finite, v, self._identity_like(v, v.dtype))
        info = factor(self.indptr, self.indices, v, workspace, self._opts[slot], first=False)
        return CuDSSFactors(info, v, finite & (info[0] == 0))

    def _raw_solve(self, factors, b, transpose, slot):
        tpattern = self.tpattern if transpose else None
        x = solve(factors.info, self.indptr, self.indices, factors.values, b, self._opts[slot], tpattern)
        return jnp.where(factors.ok, x, jnp.nan).astype(b.dtype)
