"""KLU inside jit: klujax's FFI handlers, wrapped so that none of klujax's traps reach diffsoup.

klujax (0.5.2) registers XLA FFI handlers for KLU (SuiteSparse's sparse LU for circuit-like
matrices) that work on raw numeric handles. We call those handlers through primitives of our
own, because its Python layer has traps for an integrator that factors once per step:

* importing it sets JAX's global ``jax_enable_x64`` and default platform to CPU: we import it
  through :func:`load_klujax`, which restores both, so a GPU user's process is left alone;
* its ``factor`` inside jit returns handles nobody frees (a leak per step): we allocate numeric
  handles once per solve (``begin``), refactor them in place each step, and free them with its
  ``free_numeric`` handler at the end, ordered after their last use by a data dependency
  (``_ordering.depends_on``); all three calls are marked side-effecting, so XLA neither drops nor merges them;
* in-place refactorization has no data dependency XLA can see: the handle returned by the
  refactor is what the solves take, and each integrator step is a loop iteration, so a
  refactorization always follows the solves that used the previous factors;
* its Python wrappers sort the pattern on every call (a pattern closed over as a constant made
  XLA constant-fold that sort for many seconds): our patterns are CSR, already row-major
  sorted and duplicate-free, and go straight to the handlers;
* it factors in float64 only: float32 factor modes are emulated (factors of float32-rounded
  values), which matches float32 factors' accuracy but not their speed (see the README);
* a numerically singular matrix makes the handler return an error, which aborts the whole
  jitted program: the integrator factors ``I/(h gamma) - J`` only for finite values and a finite,
  positive ``1/(h gamma)``, and replaces anything else by the identity with a failed status.
  A finite matrix that is exactly singular is still possible in principle (a user pattern
  without the Jacobian's true entries, a ``J`` with an eigenvalue exactly ``1/(h gamma)``); then
  ``simulate`` re-raises the runtime error with this explanation.

Batching: each primitive takes a leading ``n_lhs`` dimension (klujax's layout); ``vmap`` folds
its batch into that dimension, and a right-hand side batched against an unbatched factorization
(forward sensitivities: many tangents, one factorization) becomes columns of one multi-RHS solve.
"""

from __future__ import annotations

import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

from ._ordering import depends_on

_lock = threading.Lock()
_loaded = False


def load_klujax():
    """Import klujax without letting it change JAX's global configuration; register our targets."""
    global _loaded
    with _lock:
        if _loaded:
            return
        saved = {name: jax.config.values[name] for name in ("jax_enable_x64", "jax_platform_name")}
        # klujax sets jax_platform_name="cpu" while it imports; JAX caches the default backend on
        # first use, so settle it now (on a GPU machine: the GPU) before klujax can pin it to CPU.
        jax.default_backend()
        try:
            import klujax  # noqa: F401  (registers its FFI targets)
            import klujax_cpp
        except ImportError as err:  # pragma: no cover - klujax is a dependency
            raise ImportError(
                "ds.linear.KLU needs the klujax package (pip install klujax); or use ds.linear.Dense()."
            ) from err
        finally:
            for name, value in saved.items():
                jax.config.update(name, value)
        jax.ffi.register_ffi_target("diffsoup_klu_free_numeric", klujax_cpp.free_numeric(), platform="cpu")
        jax.ffi.register_ffi_target("diffsoup_klu_free_symbolic", klujax_cpp.free_symbolic(), platform="cpu")
        _loaded = True




# ----------------------------------------------------------------------------------------------
# Primitives (no autodiff rules: the integrator's solve has its own JVP and adjoint)
# ----------------------------------------------------------------------------------------------

klu_factor_p = Primitive("diffsoup_klu_factor")  # (Ai, Aj, Ax[L,nnz], sym) -> handles[L]
klu_refactor_p = Primitive("diffsoup_klu_refactor")  # (Ai, Aj, Ax[L,nnz], sym, num[L]) -> num[L]
klu_solve_p = Primitive("diffsoup_klu_solve")  # (sym, num[L], b[L,n,k]; transpose) -> x[L,n,k]
klu_free_p = Primitive("diffsoup_klu_free")  # (num[L]) -> int32[]
klu_analyze_p = Primitive("diffsoup_klu_analyze")  # (Ai, Aj, n) -> sym
klu_free_symbolic_p = Primitive("diffsoup_klu_free_symbolic")  # (sym) -> int32[]

_U64 = np.dtype(np.uint64)

klu_factor_p.def_abstract_eval(lambda Ai, Aj, Ax, sym: jax.core.ShapedArray(Ax.shape[:1], _U64))
klu_refactor_p.def_abstract_eval(lambda Ai, Aj, Ax, sym, num: jax.core.ShapedArray(num.shape, _U64))
klu_solve_p.def_abstract_eval(lambda sym, num, b, *, transpose: jax.core.ShapedArray(b.shape, b.dtype))
klu_free_p.def_abstract_eval(lambda num: jax.core.ShapedArray((), np.dtype(np.int32)))
klu_analyze_p.def_abstract_eval(lambda Ai, Aj, n: jax.core.ShapedArray((), _U64))
klu_free_symbolic_p.def_abstract_eval(lambda sym: jax.core.ShapedArray((), np.dtype(np.int32)))

def _impl_by_jit(prim):
    # Eager use (outside jit) compiles the single primitive, like any jax.numpy call.
    prim.def_impl(lambda *args, **params: jax.jit(functools.partial(prim.bind, **params))(*args))


for _prim in (klu_factor_p, klu_refactor_p, klu_solve_p, klu_free_p, klu_analyze_p, klu_free_symbolic_p):
    _impl_by_jit(_prim)

mlir.register_lowering(klu_factor_p, jax.ffi.ffi_lowering("factor_f64", has_side_effect=True), platform="cpu")
mlir.register_lowering(
    klu_refactor_p, jax.ffi.ffi_lowering("refactor_f64", has_side_effect=True), platform="cpu"
)


def _free_lowered(num):
    call = jax.ffi.ffi_call("diffsoup_klu_free_numeric", jax.ShapeDtypeStruct((), jnp.int32), has_side_effect=True)
    return call(num)


mlir.register_lowering(klu_free_p, mlir.lower_fun(_free_lowered, multiple_results=False), platform="cpu")
mlir.register_lowering(klu_analyze_p, jax.ffi.ffi_lowering("analyze", has_side_effect=True), platform="cpu")


def _free_symbolic_lowered(sym):
    call = jax.ffi.ffi_call("diffsoup_klu_free_symbolic", jax.ShapeDtypeStruct((), jnp.int32), has_side_effect=True)
    return call(sym)


mlir.register_lowering(
    klu_free_symbolic_p, mlir.lower_fun(_free_symbolic_lowered, multiple_results=False), platform="cpu"
)


def _solve_lowering(ctx, sym, num, b, *, transpose):
    target = "tsolve_with_numeric_f64" if transpose else "solve_with_numeric_f64"
    return jax.ffi.ffi_lowering(target)(ctx, sym, num, b)


mlir.register_lowering(klu_solve_p, _solve_lowering, platform="cpu")


_NOT_MAPPED = None  # how JAX marks an unbatched operand in a batching rule


def _merge(x, bdim, size):
    """Move the batch dimension to the front and merge it into the ``n_lhs`` dimension."""
    x = jnp.moveaxis(x, bdim, 0)
    return x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])


def _one_pattern(x, bdim):
    """The pattern (``Ai``, ``Aj``) or its analysis (``sym``) of a batched call, unbatched.

    One prepared solver has one pattern, so these are batched only as copies: a ``lax.cond``
    whose predicate is batched (``"adaptive"``'s fallback under ``vmap`` over experiments)
    broadcasts every operand of its branches, constants included.
    """
    return x if bdim is _NOT_MAPPED else jnp.take(x, 0, axis=bdim)


def _factor_batch(args, dims):
    Ai, Aj, Ax, sym = args
    Ai, Aj, sym = _one_pattern(Ai, dims[0]), _one_pattern(Aj, dims[1]), _one_pattern(sym, dims[3])
    size = Ax.shape[dims[2]]
    ax = _merge(Ax, dims[2], size)
    out = klu_factor_p.bind(Ai, Aj, ax, sym)
    return out.reshape((size, -1)), 0


def _refactor_batch(args, dims):
    Ai, Aj, Ax, sym, num = args
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not _NOT_MAPPED)
    Ai, Aj, sym = _one_pattern(Ai, dims[0]), _one_pattern(Aj, dims[1]), _one_pattern(sym, dims[3])
    if dims[2] is _NOT_MAPPED:  # batched handles, one matrix: each handle factors it
        Ax = jnp.broadcast_to(Ax, (size,) + Ax.shape)
        dims = dims[:2] + (0,) + dims[3:]
    if dims[4] is _NOT_MAPPED:
        raise NotImplementedError("KLU: batched values need batched handles (allocate them under the same vmap)")
    ax = _merge(Ax, dims[2], size)
    h = _merge(num, dims[4], size)
    out = klu_refactor_p.bind(Ai, Aj, ax, sym, h)
    return out.reshape((size, -1)), 0


def _solve_batch(args, dims, *, transpose):
    sym, num, b = args
    sym = _one_pattern(sym, dims[0])
    nd, bd = dims[1], dims[2]
    if nd is _NOT_MAPPED:
        # One factorization, many right-hand sides: fold the batch into the RHS columns.
        size = b.shape[bd]
        bb = jnp.moveaxis(b, bd, -1)  # (L, n, k, B)
        L, n, k = bb.shape[:3]
        x = klu_solve_p.bind(sym, num, bb.reshape(L, n, k * size), transpose=transpose)
        return x.reshape(L, n, k, size), 3
    size = num.shape[nd]
    h = _merge(num, nd, size)
    bb = _merge(b, bd, size) if bd is not _NOT_MAPPED else jnp.tile(b, (size, 1, 1))
    x = klu_solve_p.bind(sym, h, bb, transpose=transpose)
    return x.reshape((size, -1) + x.shape[1:]), 0


def _free_batch(args, dims):
    (num,) = args
    return klu_free_p.bind(_merge(num, dims[0], num.shape[dims[0]])), _NOT_MAPPED


batching.primitive_batchers[klu_factor_p] = _factor_batch
batching.primitive_batchers[klu_refactor_p] = _refactor_batch
batching.primitive_batchers[klu_solve_p] = _solve_batch
batching.primitive_batchers[klu_free_p] = _free_batch
# One pattern per prepared solver: its analysis is never batched (operands batched only as copies).
batching.primitive_batchers[klu_analyze_p] = lambda args, dims: (
    klu_analyze_p.bind(*(_one_pattern(a, d) for a, d in zip(args, dims))), _NOT_MAPPED)
batching.primitive_batchers[klu_free_symbolic_p] = lambda args, dims: (
    klu_free_symbolic_p.bind(_one_pattern(args[0], dims[0])), _NOT_MAPPED)


# ----------------------------------------------------------------------------------------------
# Functions on unbatched values (vmap adds the batch)
# ----------------------------------------------------------------------------------------------


def analyze(Ai, Aj, n):
    """KLU's symbolic analysis of the pattern, inside the program (a handle freed by
    :func:`free_symbolic`): a compiled program holds no process-specific address, so the
    persistent compilation cache can keep it."""
    return klu_analyze_p.bind(Ai, Aj, np.int32(n))


def factor(Ai, Aj, values, sym):
    return klu_factor_p.bind(Ai, Aj, values[None].astype(jnp.float64), sym)


def refactor(Ai, Aj, values, sym, num):
    return klu_refactor_p.bind(Ai, Aj, values[None].astype(jnp.float64), sym, num)


def solve(sym, num, b, transpose):
    dtype = b.dtype
    vector = b.ndim == 1
    bb = b.reshape(1, b.shape[0], -1).astype(jnp.float64)
    x = klu_solve_p.bind(sym, num, bb, transpose=bool(transpose))[0]
    return (x[:, 0] if vector else x).astype(dtype)


def free(num, after):
    """Release numeric handles once ``after`` (any pytree) is computed (one release per handle,
    also under vmap: an unbatched handle stays unbatched)."""
    return klu_free_p.bind(depends_on(num, after))


def free_symbolic(sym, after):
    """Release a symbolic analysis once ``after`` (any pytree) is computed."""
    return klu_free_symbolic_p.bind(depends_on(sym, after))
