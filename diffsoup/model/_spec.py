"""What the user writes (``ProblemSpec``) and what the integrator runs (``Problem``)."""

from __future__ import annotations

import hashlib
import inspect
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .._layout import Layout
from .._precision import Precision
from ..linear import LinearSolver, default_solver
from ._sparsity import SparsityPattern, detect_sparsity


class ProblemSpec:
    """An ODE system ``dy/dt = rhs(t, y, p)`` written in JAX.

    Args:
        rhs: ``rhs(t, y, p) -> dy/dt``, with ``t`` a scalar, ``y`` a 1-D array of the states and
            ``p`` a dict of the named parameters (scalars); it returns an array shaped like ``y``.
        states: number of states, or their names.
        parameters: parameter names with default values (a mapping), or names alone (defaults
            must then be given to ``simulate``).
        jac_sparsity: the Jacobian's sparsity pattern (scipy sparse matrix or boolean array), to
            override the one found from ``rhs``.
        y0: default initial state (optional).
        name: a name for messages.
        identity: text that identifies ``rhs`` beyond its source code, for content hashes (a
            reaction network passes its reactions: every network shares one ``rhs`` method).

    Raises:
        ValueError, TypeError: for a non-callable ``rhs``, no states, duplicate names, non-finite
            defaults or a sparsity pattern of the wrong shape.
    """

    def __init__(
        self,
        rhs: Callable,
        *,
        states: int | Sequence[str],
        parameters: Mapping[str, float] | Sequence[str] = (),
        jac_sparsity: Any = None,
        y0: Any = None,
        name: str | None = None,
        identity: str = "",
    ):
        if not callable(rhs):
            raise TypeError(f"ProblemSpec: rhs must be a function rhs(t, y, p); got {type(rhs).__name__}.")
        self.rhs = rhs
        self.name = name or getattr(rhs, "__name__", "problem")
        self.identity = str(identity)
        if isinstance(states, (int, np.integer)) and not isinstance(states, bool):
            if states < 1:
                raise ValueError(f"ProblemSpec {self.name!r}: states={states} must be at least 1.")
            self.state_names = tuple(f"y{i}" for i in range(int(states)))
        else:
            names = tuple(states)
            if not names or not all(isinstance(s, str) and s for s in names):
                raise ValueError(f"ProblemSpec {self.name!r}: states must be a count or non-empty names.")
            _no_duplicates(names, "state", self.name)
            self.state_names = names
        if isinstance(parameters, Mapping):
            self.parameter_names = tuple(parameters)
            defaults = [parameters[k] for k in self.parameter_names]
            if any(d is None for d in defaults):
                self.parameter_defaults = None
            else:
                self.parameter_defaults = np.asarray(defaults, dtype=np.float64)
                if not np.all(np.isfinite(self.parameter_defaults)):
                    bad = [k for k, v in zip(self.parameter_names, self.parameter_defaults) if not np.isfinite(v)]
                    raise ValueError(f"ProblemSpec {self.name!r}: default values of {bad} are not finite.")
        else:
            self.parameter_names = tuple(parameters)
            self.parameter_defaults = None
        if not all(isinstance(k, str) and k for k in self.parameter_names):
            raise ValueError(f"ProblemSpec {self.name!r}: parameter names must be non-empty strings.")
        _no_duplicates(self.parameter_names, "parameter", self.name)
        self.jac_sparsity = jac_sparsity
        if jac_sparsity is not None:
            shape = getattr(jac_sparsity, "shape", None)
            if shape != (self.n_states, self.n_states):
                raise ValueError(
                    f"ProblemSpec {self.name!r}: jac_sparsity has shape {shape}, expected "
                    f"({self.n_states}, {self.n_states})."
                )
        self.y0 = None if y0 is None else np.asarray(y0, dtype=np.float64)
        if self.y0 is not None and self.y0.shape != (self.n_states,):
            raise ValueError(f"ProblemSpec {self.name!r}: y0 has shape {self.y0.shape}, expected ({self.n_states},).")

    @property
    def n_states(self) -> int:
        return len(self.state_names)

    def build(
        self,
        *,
        precision: Precision | None = None,
        layout: Layout | None = None,
        linear_solver: Any = None,
    ) -> "Problem":
        """Compile-ready problem: sparsity pattern, coloring, linear solver prepared.

        Args:
            precision: the dtype policy (default ``Precision()``, float64).
            layout: placement; its ``reorder`` picks the elimination order of ``Dense`` and cuDSS.
                A ``"model"`` axis over several devices (factoring one problem across devices,
                which needs cuDSS on several GPUs) is not available yet and raises.
            linear_solver: ``ds.linear.Dense()``, ``ds.linear.KLU()``, ``ds.linear.CuDSS()``, or
                None for the default (dense up to 64 states, KLU on CPU above).

        Raises:
            ValueError: if ``rhs`` returns the wrong shape or dtype, or fails on the defaults, or
                ``layout.mesh`` has a ``"model"`` axis over several devices.
            RuntimeError: if the precision needs float64 while JAX's x64 mode is off.
        """
        return Problem(self, precision or Precision(), layout or Layout(), linear_solver)

    def __repr__(self) -> str:
        return f"ProblemSpec({self.name!r}, states={self.n_states}, parameters={list(self.parameter_names)})"


def _no_duplicates(names, what, problem):
    seen, dup = set(), []
    for n in names:
        if n in seen:
            dup.append(n)
        seen.add(n)
    if dup:
        raise ValueError(f"ProblemSpec {problem!r}: duplicate {what} names {dup}.")


class Problem:
    """A built problem: what ``ds.simulate`` runs. Make it with ``spec.build(...)``.

    Attributes:
        spec, precision, layout, linear_solver: as given (the solver resolved).
        pattern: the Jacobian's :class:`SparsityPattern` (with its diagonal) and coloring.
        sparsity_method: ``"jaxpr"``, ``"probing"`` or ``"user"``.
        n_states, state_names, parameter_names.
    """

    def __init__(self, spec: ProblemSpec, precision: Precision, layout: Layout, linear_solver):
        if not isinstance(precision, Precision):
            raise TypeError(f"precision= must be a ds.Precision, not {type(precision).__name__}.")
        if not isinstance(layout, Layout):
            raise TypeError(f"layout= must be a ds.Layout, not {type(layout).__name__}.")
        precision.check_x64()
        self.spec = spec
        self.precision = precision
        self.layout = layout
        self.dtype = jnp.dtype(precision.compute_dtype)
        self.n_states = spec.n_states
        self.state_names = spec.state_names
        self.parameter_names = spec.parameter_names
        if linear_solver is None:
            linear_solver = default_solver(self.n_states)
        if not isinstance(linear_solver, LinearSolver):
            raise TypeError(
                f"linear_solver= must be ds.linear.Dense(), KLU() or CuDSS(), not {type(linear_solver).__name__}."
            )
        self.linear_solver = linear_solver
        # One clear error before any tracing: no solver factors across a "model" axis yet.
        layout.check_one_device_factorization(f"ds.linear.{linear_solver.name}")
        self._check_rhs()
        if spec.jac_sparsity is not None:
            self.pattern = SparsityPattern.from_matrix(spec.jac_sparsity)
            self.sparsity_method = "user"
        else:
            t0, y, p = self._example_point()
            found, self.sparsity_method = detect_sparsity(self._rhs_dict, t0, y, p)
            self.pattern = SparsityPattern.from_matrix(found)
        self.prepared = linear_solver.prepare(self.pattern, precision, layout=layout)
        self._rows = np.asarray(self.pattern.rows)
        self._colors_of_entries = np.asarray(self.pattern.colors)[self.pattern.indices]
        seeds = np.zeros((self.n_states, self.pattern.n_colors))
        seeds[np.arange(self.n_states), self.pattern.colors] = 1.0
        self._seeds = seeds

    # -- the right-hand side ------------------------------------------------------------------
    def _rhs_dict(self, t, y, p: dict):
        return self.spec.rhs(t, y, p)

    def params_dict(self, pvec) -> dict:
        return {name: pvec[i] for i, name in enumerate(self.parameter_names)}

    def rhs(self, t, y, pvec):
        """``dy/dt`` with the parameters as a vector in ``parameter_names`` order."""
        return self.spec.rhs(t, y, self.params_dict(pvec)).astype(y.dtype)

    def _example_point(self):
        dtype = self.dtype
        y = jnp.ones((self.n_states,), dtype)
        if self.spec.parameter_defaults is not None:
            p = {k: jnp.asarray(v, dtype) for k, v in zip(self.parameter_names, self.spec.parameter_defaults)}
        else:
            p = {k: jnp.ones((), dtype) for k in self.parameter_names}
        return jnp.zeros((), dtype), y, p

    def _check_rhs(self):
        t0, y, p = self._example_point()
        try:
            out = jax.eval_shape(lambda t, y, p: self.spec.rhs(t, y, p), t0, y, p)
        except Exception as err:
            raise ValueError(
                f"ProblemSpec {self.spec.name!r}: rhs(t, y, p) failed when traced with y of shape "
                f"({self.n_states},) and p = dict of {list(self.parameter_names)}: {type(err).__name__}: {err}"
            ) from err
        shape, dtype = getattr(out, "shape", None), getattr(out, "dtype", None)
        if shape != (self.n_states,):
            raise ValueError(
                f"ProblemSpec {self.spec.name!r}: rhs returned shape {shape}; it must return dy/dt "
                f"shaped like y, ({self.n_states},)."
            )
        if dtype != self.dtype:
            raise ValueError(
                f"ProblemSpec {self.spec.name!r}: rhs returned {dtype} under compute_dtype={self.dtype}; "
                "build it from y and p (e.g. jnp.zeros_like(y), y.dtype) so it follows the precision policy."
            )

    # -- parameters -----------------------------------------------------------------------------
    def parameter_vector(self, params: Any = None):
        """Parameters as a vector in ``parameter_names`` order, from a dict (missing names take the
        defaults), a sequence, or None (the defaults).

        Raises:
            ValueError: for an unknown name, a missing value without default, or a wrong length.
        """
        names = self.parameter_names
        defaults = self.spec.parameter_defaults
        if params is None:
            if defaults is None and names:
                raise ValueError(f"Problem {self.spec.name!r} has no default parameter values; pass params=.")
            return jnp.asarray(defaults if defaults is not None else np.zeros(0), self.dtype)
        if isinstance(params, Mapping):
            unknown = [k for k in params if k not in names]
            if unknown:
                raise ValueError(
                    f"Problem {self.spec.name!r}: unknown parameter name(s) {unknown}; its parameters are {list(names)}."
                )
            values = []
            for i, name in enumerate(names):
                if name in params:
                    values.append(jnp.asarray(params[name], self.dtype))
                elif defaults is not None:
                    values.append(jnp.asarray(defaults[i], self.dtype))
                else:
                    raise ValueError(f"Problem {self.spec.name!r}: no value for parameter {name!r} and no default.")
            return jnp.stack(values) if values else jnp.zeros((0,), self.dtype)
        vec = jnp.asarray(params, self.dtype)
        if vec.shape[-1:] != (len(names),):
            raise ValueError(
                f"Problem {self.spec.name!r}: params has shape {vec.shape}; expected ({len(names)},) "
                f"in the order {list(names)}, or a dict."
            )
        return vec

    # -- Jacobian values -------------------------------------------------------------------------
    def jacobian_values(self, t, y, pvec):
        """The Jacobian's values on the pattern (CSR order), one ``jvp`` per color."""
        f = lambda y_: self.rhs(t, y_, pvec)  # noqa: E731
        seeds = jnp.asarray(self._seeds, y.dtype)
        compressed = jax.vmap(lambda s: jax.jvp(f, (y,), (s,))[1], in_axes=1, out_axes=1)(seeds)
        values = compressed[self._rows, self._colors_of_entries]
        return values.astype(self.precision.effective_jacobian_values_dtype).astype(y.dtype)

    def jacobian(self, t, y, params=None) -> "np.ndarray":
        """The Jacobian at ``(t, y)`` as a scipy CSR matrix (for inspection and tests)."""
        pvec = self.parameter_vector(params)
        vals = jax.jit(self.jacobian_values)(jnp.asarray(t, self.dtype), jnp.asarray(y, self.dtype), pvec)
        return self.pattern.to_scipy(np.asarray(vals))

    @property
    def fingerprint(self) -> str:
        """A content hash of the problem (its rhs source, names, pattern, precision, solver),
        the same in every process and on every machine."""
        h = hashlib.sha256()
        try:
            src = inspect.getsource(self.spec.rhs)
        except (OSError, TypeError):
            src = getattr(self.spec.rhs, "__qualname__", repr(self.spec.rhs))
        for part in (src, self.spec.identity, self.state_names, self.parameter_names, self.pattern.fingerprint,
                     repr(self.precision),
                     repr(self.linear_solver), repr(self.spec.parameter_defaults)):  # fmt: skip
            h.update(repr(part).encode())
        return h.hexdigest()[:32]

    def __repr__(self) -> str:
        return (
            f"Problem({self.spec.name!r}, n={self.n_states}, nnz={self.pattern.nnz}, colors={self.pattern.n_colors}, "
            f"solver={self.linear_solver.name}, precision={self.precision.solve_mode}/{self.dtype})"
        )
