"""The key-value store of JAX's multi-process coordinator, wrapped once.

JAX has no public API for its coordinator's key-value store (``jax.distributed`` exposes only
``initialize``/``shutdown``), and diffsoup's multi-process runs and campaigns pass commands and
outcomes through it. This module is the only place in diffsoup allowed to import ``jax._src``; if a
JAX release moves the client, only this file changes.
"""

from __future__ import annotations

from typing import Any

# Blocking reads wait this long by default: a peer process may be busy with a long evaluation.
DEFAULT_WAIT_MS = 24 * 3_600_000


def _jax_client() -> Any:
    try:
        from jax._src import distributed as _jd
    except ImportError:  # pragma: no cover (a JAX without the module)
        return None
    return getattr(_jd.global_state, "client", None)


def is_initialized() -> bool:
    """Whether JAX's multi-process runtime (and so its key-value store) runs in this process."""
    return _jax_client() is not None


class KeyValueStore:
    """Bytes under string keys, shared by the processes of a run.

    Raises:
        RuntimeError: when made before ``ds.distributed.initialize`` started the runtime.
    """

    def __init__(self) -> None:
        client = _jax_client()
        if client is None:
            raise RuntimeError(
                "the multi-process key-value store needs JAX's distributed runtime: call "
                "ds.distributed.initialize() first (in a run started by python -m diffsoup.distributed.launch, "
                "srun, or mpirun)."
            )
        self._client = client

    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key``."""
        self._client.key_value_set_bytes(key, value)

    def get(self, key: str, timeout_ms: int = DEFAULT_WAIT_MS) -> bytes:
        """The value under ``key``, waiting up to ``timeout_ms`` for a peer to set it."""
        return self._client.blocking_key_value_get_bytes(key, int(timeout_ms))

    def try_get(self, key: str) -> bytes | None:
        """The value under ``key``, or None when it is not set yet."""
        try:
            return self._client.key_value_try_get_bytes(key)
        except Exception:  # noqa: BLE001 (the client raises a generic error for a missing key)
            return None

    def delete(self, key: str) -> None:
        """Remove ``key``."""
        self._client.key_value_delete(key)
