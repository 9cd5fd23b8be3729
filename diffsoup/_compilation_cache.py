"""JAX's persistent compilation cache for diffsoup's programs: :func:`enable_compilation_cache`.

A study's objective, gradient and Jacobian programs hold whole integrators (a Rosenbrock loop, its
checkpointed adjoint) and compile in seconds to minutes; JAX's persistent cache keeps the compiled
executables on disk, keyed by the program, the JAX/XLA versions, the device and the compile
options, so that a later process running the same programs loads them instead of compiling again.
diffsoup's own entry points (the command, the demo, Dask workers, the job scripts) call
:func:`enable_compilation_cache` at start; library users call ``ds.enable_compilation_cache()``
once, before their first evaluation.

JAX's own settings win: a cache directory set through ``JAX_COMPILATION_CACHE_DIR`` or
``jax.config.update("jax_compilation_cache_dir", ...)``, the cache switched off with
``JAX_ENABLE_COMPILATION_CACHE=false``, and a minimum compile time set through
``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` (or any value other than JAX's default) are left as
they are.

This module sits on the ground floor beside :mod:`diffsoup._settings`: importing it does nothing
and imports no JAX (JAX is imported inside the function).
"""

from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path

import jax

from ._settings import settings

# Programs that compile faster than this are not written to the cache. diffsoup's study and
# simulate programs compile in a second or more; the eager helper operations around them
# (a stack, a slice, a conversion: 10-60 ms each on a 2-core CPU) would fill the directory with
# hundreds of tiny entries whose loading costs about what compiling them does.
DEFAULT_MIN_COMPILE_SECONDS = 0.1

# JAX's own default of ``jax_persistent_cache_min_compile_time_secs``: any other value was set by
# someone (the user, or an earlier call of ours) and is kept.
_JAX_DEFAULT_MIN_COMPILE_SECONDS = 1.0
_JAX_DIR_VARIABLE = "JAX_COMPILATION_CACHE_DIR"
_JAX_MIN_TIME_VARIABLE = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"

_lock = threading.Lock()


def enable_compilation_cache(
    path: str | os.PathLike | None = None, *, min_compile_seconds: float | None = None
) -> Path | None:
    """Turn on JAX's persistent compilation cache for this process (idempotent).

    Call it before the first evaluation: programs compiled earlier are not written to the cache.

    Args:
        path: the cache's folder; None takes ``jax/`` under diffsoup's cache directory
            (``DIFFSOUP_CACHE_DIR``, default ``~/.cache/diffsoup``). On a cluster put it on a file
            system every node sees.
        min_compile_seconds: programs compiling faster than this are not written; None keeps a
            minimum the user set through JAX (``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` or
            ``jax.config``), else sets :data:`DEFAULT_MIN_COMPILE_SECONDS` (0.1 s).

    Returns:
        The cache's folder, or None when JAX's cache is switched off
        (``JAX_ENABLE_COMPILATION_CACHE=false`` / ``jax_enable_compilation_cache``). When JAX's
        own cache directory is already set (``JAX_COMPILATION_CACHE_DIR`` or
        ``jax.config.update("jax_compilation_cache_dir", ...)``), that folder is kept and
        returned, and nothing else is changed; a different ``path`` then gives a warning.

    Raises:
        ValueError: for a negative or non-finite ``min_compile_seconds``.
        OSError: when the folder cannot be made.
    """
    if min_compile_seconds is not None:
        seconds = float(min_compile_seconds)
        if not (seconds >= 0.0 and seconds != float("inf")):
            raise ValueError(
                f"enable_compilation_cache: min_compile_seconds={min_compile_seconds!r} must be a finite number "
                ">= 0 (0 writes every program to the cache)."
            )
    with _lock:
        if not jax.config.jax_enable_compilation_cache:
            return None
        configured = jax.config.jax_compilation_cache_dir
        # JAX reads JAX_COMPILATION_CACHE_DIR when it is imported; a variable set after that is
        # still the user's choice.
        user_dir = configured or os.environ.get(_JAX_DIR_VARIABLE, "").strip()
        if user_dir:
            # JAX's own setting (or an earlier call of ours): kept as it is.
            if path is not None and Path(path).expanduser().resolve() != Path(user_dir).expanduser().resolve():
                warnings.warn(
                    f"enable_compilation_cache: JAX's compilation cache is already at {user_dir!r} "
                    f"(JAX_COMPILATION_CACHE_DIR or jax.config); path={str(path)!r} is ignored.",
                    UserWarning,
                    stacklevel=2,
                )
            if not configured:
                jax.config.update("jax_compilation_cache_dir", user_dir)
            if min_compile_seconds is not None:
                jax.config.update("jax_persistent_cache_min_compile_time_secs", seconds)
            return Path(user_dir)
        directory = Path(path) if path is not None else settings().jax_cache_dir
        directory = directory.expanduser()
        directory.mkdir(parents=True, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", str(directory))
        if min_compile_seconds is not None:
            jax.config.update("jax_persistent_cache_min_compile_time_secs", seconds)
        elif not _user_set_min_compile_time(jax):
            jax.config.update("jax_persistent_cache_min_compile_time_secs", DEFAULT_MIN_COMPILE_SECONDS)
        return directory


def _user_set_min_compile_time(jax) -> bool:
    if os.environ.get(_JAX_MIN_TIME_VARIABLE, "").strip():
        return True
    return float(jax.config.jax_persistent_cache_min_compile_time_secs) != _JAX_DEFAULT_MIN_COMPILE_SECONDS
