"""Jacobian sparsity: the pattern, found once from the jaxpr of the right-hand side, and its coloring.

The pattern is found by propagating, through the jaxpr of ``y -> f(t, y, p)``, the set of state
indices each intermediate element depends on (the approach of SparseConnectivityTracer.jl and
of JAX's own sparsity experiments), held as sparse boolean matrices. No Jacobian, dense or sparse,
is evaluated. Index-moving primitives (reshape, slicing, gather, concatenate, pad, ...) are handled
generically by running the primitive on arrays of element ids. Dependencies through values that
have no derivative (comparisons, ``floor``, ``sign``, integer casts) are dropped, since they do not
make Jacobian entries; multiplication by a constant zero drops them too.

Where the jaxpr uses a primitive this tracer does not know (``while`` loops inside ``f``, sorting,
convolutions), it falls back to probing: columns of the Jacobian in chunks by ``jvp`` at random
states, so memory stays at one chunk of columns. The fallback is reported with a warning; pass
``jac_sparsity=`` to ``ProblemSpec`` to give the pattern yourself.

Columns are colored so that no two columns of one color share a row (distance-2 coloring of the
column intersection graph, greedy over several orderings, the best kept); the Jacobian's values
then cost one ``jvp`` per color (Curtis, Powell and Reid 1974).
"""

from __future__ import annotations

import dataclasses
import hashlib
import warnings
from typing import TYPE_CHECKING, Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import ClosedJaxpr

if TYPE_CHECKING:
    import scipy.sparse as sp

# scipy.sparse is imported inside the functions that use it (at ``spec.build``), not here: it
# takes longer to import than the rest of the model layer, and ``import diffsoup`` stays light.

# ----------------------------------------------------------------------------------------------
# The pattern
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class SparsityPattern:
    """A square CSR sparsity pattern with its column coloring.

    Attributes:
        n: number of rows and columns.
        indptr, indices: the CSR structure (sorted column indices per row, no duplicates).
        rows: the row of each stored entry (COO rows in CSR order).
        colors: color of each column; columns of one color share no row.
        n_colors: number of colors.
        diagonal: position of each diagonal entry in the stored entries (the pattern always holds
            the diagonal, since the integrator factors ``I/(h gamma) - J``).
    """

    n: int
    indptr: np.ndarray
    indices: np.ndarray
    colors: np.ndarray
    n_colors: int

    @classmethod
    def from_matrix(cls, matrix: Any, *, include_diagonal: bool = True) -> "SparsityPattern":
        """Make a pattern from anything scipy can read as a sparse matrix (or a dense boolean array)."""
        import scipy.sparse as sp
        m = sp.csr_matrix(matrix, dtype=bool)
        if m.shape[0] != m.shape[1]:
            raise ValueError(f"A Jacobian sparsity pattern must be square; got shape {m.shape}.")
        if include_diagonal:
            m = (m + sp.identity(m.shape[0], dtype=bool, format="csr")).tocsr()
        m.sum_duplicates()
        m.sort_indices()
        m.eliminate_zeros()
        indptr = np.asarray(m.indptr, dtype=np.int32)
        indices = np.asarray(m.indices, dtype=np.int32)
        colors = color_columns(m)
        return cls(int(m.shape[0]), indptr, indices, colors, int(colors.max(initial=-1) + 1))

    @property
    def nnz(self) -> int:
        return int(self.indices.shape[0])

    @property
    def rows(self) -> np.ndarray:
        return np.repeat(np.arange(self.n, dtype=np.int32), np.diff(self.indptr))

    @property
    def diagonal(self) -> np.ndarray:
        rows = self.rows
        where = np.nonzero(rows == self.indices)[0]
        if where.shape[0] != self.n:
            raise ValueError("this pattern lacks some diagonal entries")
        return where.astype(np.int32)

    @property
    def transpose_permutation(self) -> np.ndarray:
        """Positions of the entries of the transposed matrix, in its CSR order."""
        import scipy.sparse as sp
        coo = sp.csr_matrix((np.arange(self.nnz) + 1, self.indices, self.indptr), shape=(self.n, self.n))
        t = coo.T.tocsr()
        t.sort_indices()
        return (t.data - 1).astype(np.int32)

    def to_scipy(self, values: np.ndarray | None = None) -> sp.csr_matrix:
        import scipy.sparse as sp
        data = np.ones(self.nnz, dtype=bool) if values is None else np.asarray(values)
        return sp.csr_matrix((data, self.indices, self.indptr), shape=(self.n, self.n))

    @property
    def fingerprint(self) -> str:
        """A content hash of the structure, the same in every process and on every machine."""
        h = hashlib.sha256()
        h.update(np.int64(self.n).tobytes())
        h.update(self.indptr.astype(np.int64).tobytes())
        h.update(self.indices.astype(np.int64).tobytes())
        return h.hexdigest()[:32]

    def __repr__(self) -> str:
        return f"SparsityPattern(n={self.n}, nnz={self.nnz}, n_colors={self.n_colors})"


# ----------------------------------------------------------------------------------------------
# Coloring
# ----------------------------------------------------------------------------------------------


def _greedy(adj: sp.csr_matrix, order: np.ndarray) -> np.ndarray:
    n = adj.shape[0]
    colors = np.full(n, -1, dtype=np.int64)
    indptr, indices = adj.indptr, adj.indices
    mark = np.full(n + 1, -1, dtype=np.int64)  # mark[c] == v: color c is taken by a neighbour of v
    for v in order:
        neigh = colors[indices[indptr[v] : indptr[v + 1]]]
        mark[neigh[neigh >= 0]] = v
        c = 0
        while mark[c] == v:
            c += 1
        colors[v] = c
    return colors


def color_columns(pattern: sp.csr_matrix) -> np.ndarray:
    """Distance-2 column coloring: columns sharing a row get different colors.

    Greedy coloring over three orderings (natural, largest degree first, smallest-last); the one
    with fewest colors is kept.
    """
    import scipy.sparse as sp
    # Boolean products (sums are ORs): an integer count of shared rows could wrap around to 0.
    p = sp.csr_matrix(pattern, dtype=bool)
    adj = (p.T @ p).tocsr()  # columns i, j conflict iff they share a row
    adj.setdiag(0)
    adj.eliminate_zeros()
    n = adj.shape[0]
    degree = np.diff(adj.indptr)
    orders = [np.arange(n), np.argsort(-degree, kind="stable")]
    orders.append(_smallest_last(adj, degree))
    best = None
    for order in orders:
        colors = _greedy(adj, order)
        if best is None or colors.max(initial=-1) < best.max(initial=-1):
            best = colors
    return best.astype(np.int32)


def _smallest_last(adj: sp.csr_matrix, degree: np.ndarray) -> np.ndarray:
    """Smallest-last ordering (Matula and Beck 1983), with bucket queues."""
    n = adj.shape[0]
    deg = degree.astype(np.int64).copy()
    removed = np.zeros(n, dtype=bool)
    buckets: dict[int, set[int]] = {}
    for v in range(n):
        buckets.setdefault(int(deg[v]), set()).add(v)
    order = np.empty(n, dtype=np.int64)
    low = 0
    for pos in range(n - 1, -1, -1):
        while not buckets.get(low):
            low += 1
        v = buckets[low].pop()
        removed[v] = True
        order[pos] = v
        for u in adj.indices[adj.indptr[v] : adj.indptr[v + 1]]:
            if not removed[u]:
                d = int(deg[u])
                buckets[d].discard(u)
                deg[u] = d - 1
                buckets.setdefault(d - 1, set()).add(u)
        low = max(low - 1, 0)
    return order


# ----------------------------------------------------------------------------------------------
# Detection through the jaxpr
# ----------------------------------------------------------------------------------------------


class _Unsupported(Exception):
    pass


@dataclasses.dataclass
class _Var:
    """What the tracer knows of one jaxpr value."""

    shape: tuple
    deps: sp.csr_matrix | None = None  # (size, n_states) boolean; None: no state dependence
    value: np.ndarray | None = None  # concrete value, when it depends on no input at all

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


_NO_DERIVATIVE = {
    "lt", "le", "gt", "ge", "eq", "ne", "and", "or", "not", "xor", "floor", "ceil", "round",
    "sign", "is_finite", "argmax", "argmin", "reduce_and", "reduce_or", "iota", "population_count",
    "shift_left", "shift_right_logical", "shift_right_arithmetic", "stop_gradient",
}  # fmt: skip
_ELEMENTWISE = {
    "add", "sub", "mul", "div", "neg", "exp", "exp2", "log", "log1p", "expm1", "sin", "cos", "tan",
    "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "logistic",
    "sqrt", "rsqrt", "cbrt", "pow", "integer_pow", "abs", "max", "min", "square", "erf", "erfc",
    "erf_inv", "lgamma", "digamma", "convert_element_type", "copy", "copy_p", "rem", "clamp",
    "nextafter", "reduce_precision", "real", "imag", "conj", "select_n", "add_any", "tan",
}  # fmt: skip
_STRUCTURAL = {
    # primitive: indices of the operands that carry data (the others must be known values)
    "reshape": (0,), "broadcast_in_dim": (0,), "transpose": (0,), "squeeze": (0,),
    "expand_dims": (0,), "rev": (0,), "slice": (0,), "concatenate": None, "pad": (0, 1),
    "gather": (0,), "dynamic_slice": (0,), "dynamic_update_slice": (0, 1), "scatter": (0, 2),
    "split": (0,), "stack": None,
}  # fmt: skip
_REDUCTIONS = {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod"}
_CUMULATIVE = {"cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"}


def _union_broadcast(parts: list[_Var], size: int, n: int) -> sp.csr_matrix | None:
    import scipy.sparse as sp
    acc = None
    for part in parts:
        if part.deps is None:
            continue
        d = part.deps
        if part.size == 1 and size != 1:
            d = sp.csr_matrix(sp.vstack([d] * size)) if size < 64 else _repeat_rows(d, size)
        acc = d if acc is None else (acc + d)
    return None if acc is None else sp.csr_matrix(acc, dtype=bool)


def _repeat_rows(row: sp.csr_matrix, size: int) -> sp.csr_matrix:
    import scipy.sparse as sp
    idx = np.zeros(size, dtype=np.int64)
    return sp.csr_matrix(row[idx], dtype=bool)


def _select_rows(deps: sp.csr_matrix, ids: np.ndarray) -> sp.csr_matrix:
    """Rows ``ids`` of ``deps``; a negative id gives an empty row."""
    import scipy.sparse as sp
    ids = np.asarray(ids).reshape(-1)
    valid = ids >= 0
    safe = np.where(valid, ids, 0)
    out = sp.csr_matrix(deps[safe], dtype=bool)
    if not valid.all():
        out = sp.csr_matrix(sp.diags(valid, dtype=bool) @ out, dtype=bool)
    return out


class _Tracer:
    def __init__(self, n: int):
        self.n = n

    # -- entry --------------------------------------------------------------------------------
    def run(self, closed_jaxpr, inputs: list[_Var]) -> list[_Var]:
        jaxpr = closed_jaxpr.jaxpr
        env: dict[Any, _Var] = {}
        for var, const in zip(jaxpr.constvars, closed_jaxpr.consts):
            arr = np.asarray(const)
            env[var] = _Var(arr.shape, None, arr)
        for var, inp in zip(jaxpr.invars, inputs):
            env[var] = inp

        def read(atom):
            if hasattr(atom, "val"):  # a Literal
                arr = np.asarray(atom.val)
                return _Var(arr.shape, None, arr)
            return env[atom]

        for eqn in jaxpr.eqns:
            ins = [read(a) for a in eqn.invars]
            outs = self.eqn(eqn, ins)
            for var, out in zip(eqn.outvars, outs):
                env[var] = out
        return [read(a) for a in jaxpr.outvars]

    def eqn(self, eqn, ins: list[_Var]) -> list[_Var]:
        name = eqn.primitive.name
        out_shapes = [tuple(v.aval.shape) for v in eqn.outvars]
        if all(v.value is not None for v in ins) and not eqn.effects:
            try:
                res = eqn.primitive.bind(*[v.value for v in ins], **eqn.params)
            except Exception:  # noqa: BLE001 (evaluation is an optimisation: fall through)
                res = None
            if res is not None:
                res = res if eqn.primitive.multiple_results else [res]
                return [_Var(s, None, np.asarray(r)) for s, r in zip(out_shapes, res)]
        if all(v.deps is None for v in ins) and name not in ("pjit", "closed_call", "jit"):
            return [_Var(s) for s in out_shapes]
        if name in _NO_DERIVATIVE:
            return [_Var(s) for s in out_shapes]
        size = int(np.prod(out_shapes[0], dtype=np.int64)) if out_shapes else 0
        if name in _ELEMENTWISE:
            parts = ins
            if name == "select_n":
                parts = ins[1:]
            if name == "clamp":
                parts = [ins[1]]  # clamp(lo, x, hi): derivative flows through x only
            if name == "mul":
                parts = self._mul_parts(ins, size)
            return [_Var(out_shapes[0], _union_broadcast(parts, size, self.n))]
        if name in _STRUCTURAL:
            return self.structural(eqn, ins, out_shapes)
        if name in _REDUCTIONS:
            return [_Var(out_shapes[0], self.reduction(ins[0], eqn.params["axes"], out_shapes[0]))]
        if name in _CUMULATIVE:
            return [_Var(out_shapes[0], self.cumulative(ins[0], eqn.params["axis"], eqn.params["reverse"]))]
        if name == "dot_general":
            return [_Var(out_shapes[0], self.dot_general(ins[0], ins[1], eqn.params["dimension_numbers"]))]
        if name in ("pjit", "closed_call", "jit", "core_call", "remat", "checkpoint", "custom_jvp_call",
                    "custom_vjp_call", "custom_vjp_call_jaxpr"):  # fmt: skip
            inner = None
            for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
                if key in eqn.params:
                    inner = eqn.params[key]
                    break
            if inner is None:
                raise _Unsupported(name)
            if not hasattr(inner, "consts"):
                inner = ClosedJaxpr(inner, ())
            n_in = len(inner.jaxpr.invars)
            return self.run(inner, ins[len(ins) - n_in :])
        if name == "cond":
            branches = eqn.params["branches"]
            results = [self.run(b, ins[1:]) for b in branches]
            outs = []
            for k, shape in enumerate(out_shapes):
                size_k = int(np.prod(shape, dtype=np.int64))
                outs.append(_Var(shape, _union_broadcast([r[k] for r in results], size_k, self.n)))
            return outs
        raise _Unsupported(name)

    @staticmethod
    def _mul_parts(ins: list[_Var], size: int) -> list[_Var]:
        import scipy.sparse as sp
        a, b = ins
        parts = []
        for this, other in ((a, b), (b, a)):
            if this.deps is None:
                continue
            if other.value is not None and np.size(other.value) == size and this.size == size:
                keep = np.asarray(other.value).reshape(-1) != 0
                parts.append(_Var(this.shape, sp.csr_matrix(sp.diags(keep, dtype=bool) @ this.deps, dtype=bool)))
            elif other.value is not None and np.size(other.value) == 1 and float(np.asarray(other.value)) == 0.0:
                continue
            else:
                parts.append(this)
        return parts

    def structural(self, eqn, ins: list[_Var], out_shapes) -> list[_Var]:
        import scipy.sparse as sp
        name = eqn.primitive.name
        data_pos = _STRUCTURAL[name]
        if data_pos is None:
            data_pos = tuple(range(len(ins)))
        operands, blocks, offset = [], [], 0
        for k, v in enumerate(ins):
            if k in data_pos:
                ids = np.arange(offset, offset + v.size, dtype=np.int32).reshape(v.shape)
                operands.append(ids)
                deps = v.deps if v.deps is not None else sp.csr_matrix((v.size, self.n), dtype=bool)
                blocks.append(deps)
                offset += v.size
            else:
                if v.value is None:
                    raise _Unsupported(f"{name} with traced indices")
                operands.append(v.value)
        params = dict(eqn.params)
        if name == "gather" and params.get("fill_value") is None:
            params["fill_value"] = -1
        if name == "scatter":
            params.pop("update_jaxpr", None)
            params.pop("update_consts", None)
            res = jax.lax.scatter(operands[0], operands[1], operands[2], params["dimension_numbers"],
                                  indices_are_sorted=params["indices_are_sorted"],
                                  unique_indices=params["unique_indices"], mode=params["mode"])  # fmt: skip
            results = [res]
        else:
            res = eqn.primitive.bind(*operands, **params)
            results = res if eqn.primitive.multiple_results else [res]
        stacked = sp.csr_matrix(sp.vstack(blocks), dtype=bool) if blocks else None
        return [_Var(s, _select_rows(stacked, np.asarray(r))) for s, r in zip(out_shapes, results)]

    def reduction(self, v: _Var, axes, out_shape) -> sp.csr_matrix:
        import scipy.sparse as sp
        shape = v.shape
        keep = [d for d in range(len(shape)) if d not in axes]
        idx = np.indices(shape).reshape(len(shape), -1) if shape else np.zeros((0, 1), dtype=np.int64)
        out_idx = np.ravel_multi_index(tuple(idx[keep]), tuple(shape[d] for d in keep)) if keep else np.zeros(v.size, dtype=np.int64)
        out_size = int(np.prod(out_shape, dtype=np.int64))
        g = sp.csr_matrix((np.ones(v.size, dtype=bool), (out_idx, np.arange(v.size))), shape=(out_size, v.size))
        return sp.csr_matrix(g @ v.deps, dtype=bool)

    def cumulative(self, v: _Var, axis: int, reverse: bool) -> sp.csr_matrix:
        import scipy.sparse as sp
        ids = np.arange(v.size).reshape(v.shape)
        moved = np.moveaxis(ids, axis, -1).reshape(-1, v.shape[axis])
        rows, cols = [], []
        length = v.shape[axis]
        for i in range(length):
            sel = range(i, length) if reverse else range(0, i + 1)
            for j in sel:
                rows.append(moved[:, i])
                cols.append(moved[:, j])
        rows, cols = np.concatenate(rows), np.concatenate(cols)
        g = sp.csr_matrix((np.ones(rows.size, dtype=bool), (rows, cols)), shape=(v.size, v.size))
        return sp.csr_matrix(g @ v.deps, dtype=bool)

    def dot_general(self, lhs: _Var, rhs: _Var, dimension_numbers) -> sp.csr_matrix | None:
        import scipy.sparse as sp
        (lc, rc), (lb, rb) = dimension_numbers
        lf = [d for d in range(len(lhs.shape)) if d not in lc and d not in lb]
        rf = [d for d in range(len(rhs.shape)) if d not in rc and d not in rb]
        bsz = int(np.prod([lhs.shape[d] for d in lb], dtype=np.int64))
        isz = int(np.prod([lhs.shape[d] for d in lf], dtype=np.int64))
        ksz = int(np.prod([lhs.shape[d] for d in lc], dtype=np.int64))
        jsz = int(np.prod([rhs.shape[d] for d in rf], dtype=np.int64))
        lids = np.arange(lhs.size).reshape(lhs.shape).transpose(list(lb) + lf + list(lc)).reshape(bsz, isz, ksz)
        rids = np.arange(rhs.size).reshape(rhs.shape).transpose(list(rb) + list(rc) + rf).reshape(bsz, ksz, jsz)
        out = np.arange(bsz * isz * jsz).reshape(bsz, isz, jsz)

        def mask(v: _Var, ids):
            if v.value is not None:
                return np.asarray(v.value).reshape(-1)[ids] != 0
            return np.ones(ids.shape, dtype=bool)

        acc = None
        if lhs.deps is not None:
            b, k, j = np.nonzero(mask(rhs, rids))
            rows = out[b[:, None], np.arange(isz)[None, :], j[:, None]].reshape(-1)
            cols = lids[b[:, None], np.arange(isz)[None, :], k[:, None]].reshape(-1)
            s = sp.csr_matrix((np.ones(rows.size, dtype=bool), (rows, cols)), shape=(out.size, lhs.size))
            acc = s @ lhs.deps
        if rhs.deps is not None:
            b, i, k = np.nonzero(mask(lhs, lids))
            rows = out[b[:, None], i[:, None], np.arange(jsz)[None, :]].reshape(-1)
            cols = rids[b[:, None], k[:, None], np.arange(jsz)[None, :]].reshape(-1)
            s = sp.csr_matrix((np.ones(rows.size, dtype=bool), (rows, cols)), shape=(out.size, rhs.size))
            part = s @ rhs.deps
            acc = part if acc is None else acc + part
        return None if acc is None else sp.csr_matrix(acc, dtype=bool)


def _probe(fn_y: Callable, y: np.ndarray, *, chunk: int = 128, seed: int = 0) -> sp.csr_matrix:
    """Pattern from Jacobian columns, ``chunk`` at a time, at two random states (OR of both)."""
    import scipy.sparse as sp

    n = y.shape[0]
    rng = np.random.default_rng(seed)
    pattern = sp.csr_matrix((n, n), dtype=bool)
    for point in range(2):
        y_probe = jnp.asarray(y + rng.standard_normal(n) * (1.0 + np.abs(y)), dtype=y.dtype)
        jvp_cols = jax.jit(jax.vmap(lambda v: jax.jvp(fn_y, (y_probe,), (v,))[1], in_axes=1, out_axes=1))
        for start in range(0, n, chunk):
            stop = min(start + chunk, n)
            seeds = np.zeros((n, stop - start), dtype=y.dtype)
            seeds[np.arange(start, stop), np.arange(stop - start)] = 1.0
            cols = np.asarray(jvp_cols(jnp.asarray(seeds)))
            r, c = np.nonzero((cols != 0) | ~np.isfinite(cols))
            pattern = pattern + sp.csr_matrix((np.ones(r.size, dtype=bool), (r, c + start)), shape=(n, n))
    return sp.csr_matrix(pattern, dtype=bool)


def detect_sparsity(rhs: Callable, t: Any, y: np.ndarray, p: Any) -> tuple[sp.csr_matrix, str]:
    """The Jacobian pattern of ``y -> rhs(t, y, p)`` (without the diagonal) and how it was found.

    Returns:
        ``(pattern, method)``, method ``"jaxpr"`` or ``"probing"``.
    """
    import scipy.sparse as sp

    n = int(y.shape[0])
    closed = jax.make_jaxpr(lambda y_, p_, t_: rhs(t_, y_, p_))(y, p, t)
    p_leaves = jax.tree_util.tree_leaves(p)
    inputs = [_Var((n,), sp.identity(n, dtype=bool, format="csr"))]
    inputs += [_Var(tuple(np.shape(leaf))) for leaf in p_leaves]
    inputs += [_Var(tuple(np.shape(t)))]
    try:
        (out,) = _Tracer(n).run(closed, inputs)
        deps = out.deps if out.deps is not None else sp.csr_matrix((n, n), dtype=bool)
        if out.size != n:
            raise _Unsupported("output size")
        return sp.csr_matrix(deps, dtype=bool), "jaxpr"
    except _Unsupported as err:
        warnings.warn(
            f"diffsoup: the sparsity tracer does not know the primitive {err.args[0]!r} used in the "
            "right-hand side; the Jacobian pattern was found by probing columns at random states "
            "instead (slower, and it can miss entries that are zero at those states). Pass "
            "jac_sparsity= to ProblemSpec to give the pattern yourself.",
            stacklevel=3,
        )
        return _probe(lambda y_: rhs(t, y_, p), np.asarray(y)), "probing"
