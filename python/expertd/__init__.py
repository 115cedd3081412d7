"""expertd for Python: experts of a Mixture-of-Experts model from a running expertd's shared cache.

``Client.connect(path)`` opens a connection; ``Client.acquire(layer, experts)`` returns a
:class:`Lease` (a context manager) whose ``view(i)`` is the i-th requested expert's slot as a
read-only ``uint8`` NumPy array over the daemon's shared memory (no copy), ``tensor(i, role)``
one role of it (gate, up, down, ...) typed where NumPy has the type, and ``torch(i, role)`` the
same memory as a ``torch.Tensor`` (DLPack). ``dequantize`` turns any weight type the kernels run
into float32. ``expertd.torch`` (needs torch and transformers) serves a Hugging Face MoE model's
experts from expertd.

An array keeps its lease: the daemon is told to release the slots only once the ``with`` block has
ended *and* every array of the lease is gone, so an array never reads a slot that was given to
another expert. A client holds one lease at a time (the daemon's rule): acquiring again while an
earlier lease, or an array of it, is alive raises :class:`Error` saying so (copy what you keep).
Every failure is an :class:`Error` whose message names the cause.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from ._expertd import Client as _RawClient
from ._expertd import Error
from ._expertd import dequantize as _dequantize
from ._expertd import type_id as _type_id

__all__ = ["Client", "Lease", "Error", "dequantize"]


class Lease:
    """Experts of one layer pinned in the daemon's cache; use it in a ``with`` block."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        """Ends the lease (the slots go back once no array of it is alive)."""
        self._raw.close()

    @property
    def layer(self) -> int:
        return self._raw.layer

    @property
    def experts(self) -> List[int]:
        return list(self._raw.experts)

    def __len__(self) -> int:
        return len(self._raw)

    def is_ready(self, i: int) -> bool:
        """Whether expert i (an index into ``experts``) may be read now."""
        return self._raw.is_ready(i)

    def wait(self, i: Optional[int] = None) -> None:
        """Blocks until expert i (or every expert) is ready; a failed read raises Error."""
        self._raw.wait(i)

    def next_ready(self) -> Optional[int]:
        """Blocks until one more expert is ready and returns its index: each expert once, those
        ready at the acquire first; None when every expert has been returned. With more experts
        than one request may pin, hand used ones back with ``done`` as you go."""
        return self._raw.next_ready()

    def view(self, i: int) -> np.ndarray:
        """Expert i's whole slot, read-only uint8, no copy (waits for the expert)."""
        return self._raw.view(i)

    def tensor(self, i: int, role: str) -> np.ndarray:
        """One role of expert i: float32 / float16 rows, or its quantized rows as uint8."""
        return self._raw.tensor(i, role)

    def torch(self, i: int, role: Optional[str] = None) -> Any:
        """The same memory as ``view(i)`` (no role) or ``tensor(i, role)`` as a ``torch.Tensor``
        through DLPack, without a copy; on a cuda expertd a CUDA tensor over the slot's IPC
        mapping, ready for work on the legacy default stream. torch has no read-only tensors: the arena is mapped
        read-only into this process, so writing one faults; ``.clone()`` what you change. Like
        an array, the tensor holds the lease (and its expert's slot) while it lives."""
        return self._raw.torch(i, role)

    def pointer(self, i: int, role: Optional[str] = None) -> Tuple[int, int, str]:
        """``(address, bytes, device)`` of expert i's slot (or one role of it) for consumers of raw
        pointers (CuPy, custom kernels): device is ``"cpu"``, or ``"cuda:N"`` on a cuda expertd,
        whose slot the legacy default stream was made to wait for. Valid while the lease lives
        and the expert is not handed back (a pointer does not hold the lease: keep the lease)."""
        return tuple(self._raw.pointer(i, role))  # type: ignore[return-value]

    def done(self, indices: Union[int, Iterable[int]]) -> None:
        """Hands experts (indices into ``experts``, ready ones) back before the lease ends: their
        slots go back to the daemon, and an acquire of more experts than one request may pin
        (``info["max_experts_per_request"]``) goes on with its next wave. Raises while an array
        or tensor over one of them is alive."""
        idx = [int(indices)] if isinstance(indices, int) else [int(i) for i in indices]
        self._raw.done(idx)

    def is_done(self, i: int) -> bool:
        """Whether expert i was handed back with done()."""
        return self._raw.is_done(i)


class Client:
    """A connection to expertd (one engine place in the daemon)."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self._info: Optional[Dict[str, Any]] = None

    @classmethod
    def connect(cls, path: str, name: str = "python", monitor: bool = False) -> "Client":
        """Connects and handshakes; raises Error naming why it could not. A monitor only reads
        stats: it takes no engine place in the daemon and cannot acquire."""
        return cls(_RawClient.connect(path, name, monitor))

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def info(self) -> Dict[str, Any]:
        """The model: arch, model_id, n_experts, n_experts_used, arena, slot_bytes, layers (each
        with model_layer and roles: role, type, type_name, shape (rows, columns), offset, bytes)."""
        if self._info is None:
            self._info = self._raw.info()
        return self._info

    def acquire(self, layer: int, experts: Iterable[int]) -> Lease:
        """Pins experts of a pack layer; hits are ready at once, misses as they are read."""
        return Lease(self._raw.acquire(int(layer), [int(e) for e in experts]))

    def prefetch(self, layer: int, experts: Iterable[int]) -> None:
        """Hints experts the daemon may read ahead of an acquire."""
        self._raw.prefetch(int(layer), [int(e) for e in experts])

    def stats(self) -> Dict[str, float]:
        """The daemon's counters (as ``expertctl stats``)."""
        return dict(self._raw.stats())

    def close(self) -> None:
        self._raw.close()


def dequantize(data: np.ndarray, type: Union[int, str], shape: Union[int, Sequence[int]],
               out: Optional[np.ndarray] = None) -> np.ndarray:
    """float32 values of ``shape`` ((columns,) or (rows, columns)) from the bytes of weight type
    ``type`` (a GGML type id or name: "Q8_0", "Q4_K", ...); an unsupported type raises Error.
    ``out``: a C-contiguous float32 array of as many values to write them into (returned)."""
    t = _type_id(type) if isinstance(type, str) else int(type)
    dims: Tuple[int, ...] = (int(shape),) if isinstance(shape, int) else tuple(int(x) for x in shape)
    raw = np.ascontiguousarray(np.asarray(data).view(np.uint8).reshape(-1))
    if out is not None and (out.dtype != np.float32 or not out.flags.c_contiguous
                            or not out.flags.writeable):
        raise Error("out: a writeable, C-contiguous float32 array")
    return _dequantize(raw, t, list(dims), out)
