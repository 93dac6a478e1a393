"""Dense integer slots for request ids, with numpy columns per slot: per-request state that a whole
step reads and writes with a few array operations instead of a Python loop over requests.

    slots = RequestSlots(last_step=((), np.int64, 0), trials=((64,), np.float64, 0.0))
    idx, new = slots.lookup(req_ids)         # creates slots for unseen ids (their rows reset)
    slots["trials"][idx] *= 0.9
    slots.release(req_id)                     # the slot is reused by a later request

Used by the drafting layer's ledger and the adaptive policy's estimators.
"""

from __future__ import annotations

from typing import Any, Hashable, Iterator, Sequence

import numpy as np

from spec_plugins import _ledger


class RowRange:
    """0, 1, ..., n - 1 for any n, as views of one array that grows when asked for more (an engine step where every
    row drafts asks for its rows every step)."""

    def __init__(self) -> None:
        self._rows = np.arange(0, dtype=np.int64)

    def __call__(self, n: int) -> np.ndarray:
        if len(self._rows) < n:
            self._rows = np.arange(max(n, 2 * len(self._rows)), dtype=np.int64)
        return self._rows[:n]


class RequestSlots:
    """req_id -> slot, and one numpy column per named field (shape `(capacity, *tail)`).

    Each column is declared as name=(tail shape, dtype, fill); a new slot's rows are set to `fill`.
    """

    def __init__(self, **columns: tuple[tuple[int, ...], Any, Any]) -> None:
        self._spec = columns
        self._index: dict[Hashable, int] = {}
        self._ids: list[Hashable | None] = []  # slot -> id (None: free)
        self._free: list[int] = []
        self._cols = {name: np.full((0, *tail), fill, dtype=dtype) for name, (tail, dtype, fill) in columns.items()}
        self._rows = 0  # rows allocated in every column (>= capacity)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, req_id: Hashable) -> bool:
        return req_id in self._index

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._index)

    def __getitem__(self, name: str) -> np.ndarray:
        return self._cols[name]

    @property
    def columns(self) -> dict[str, np.ndarray]:
        """name -> column, the same dict for the slots' lifetime (growing replaces its values): a step that reads
        many columns reads them from it without a call each."""
        return self._cols

    @property
    def index(self) -> dict[Hashable, int]:
        """req_id -> slot (read only: compiled steps look ids up in it directly)."""
        return self._index

    @property
    def capacity(self) -> int:
        return len(self._ids)

    def id_at(self, slot: int) -> Hashable | None:
        return self._ids[slot]

    def lookup(self, req_ids: Sequence[Hashable], create: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(slots, new): each id's slot (-1 for an unknown id when create=False) and which were created."""
        slots, unknown = _ledger.lookup_slots(self._index, req_ids)
        if not create or not unknown:
            return slots, np.zeros(len(slots), dtype=bool)
        new = slots < 0
        self._add_new(req_ids, slots, new)
        return slots, new

    def slots_of(self, req_ids: Sequence[Hashable], create: bool = True) -> np.ndarray:
        """`lookup`'s slots alone (what a step that does not ask which ids are new needs)."""
        slots, unknown = _ledger.lookup_slots(self._index, req_ids)
        if create and unknown:
            self._add_new(req_ids, slots, slots < 0)
        return slots

    def gather(self, name: str, slots: np.ndarray, default: Any) -> np.ndarray:
        """Column `name` at `slots`, with `default` where a slot is -1 (an unknown id)."""
        col = self._cols[name]
        out = np.full((len(slots), *col.shape[1:]), default, dtype=col.dtype)
        known = slots >= 0
        if known.any():
            out[known] = col[slots[known]]
        return out

    def release(self, req_id: Hashable) -> int | None:
        """Free req_id's slot; returns it, or None if the id has none."""
        slot = self._index.pop(req_id, None)
        if slot is not None:
            self._ids[slot] = None
            self._free.append(slot)
        return slot

    def _add_new(self, req_ids: Sequence[Hashable], slots: np.ndarray, new: np.ndarray) -> None:
        for i in np.flatnonzero(new).tolist():
            slots[i] = self._add(req_ids[i])

    def _add(self, req_id: Hashable) -> int:
        if self._free:
            slot = self._free.pop()
        else:
            slot = len(self._ids)
            self._ids.append(None)
            if slot >= self._rows:
                grow = max(64, slot)
                for name, (tail, dtype, fill) in self._spec.items():
                    self._cols[name] = np.concatenate([self._cols[name], np.full((grow, *tail), fill, dtype=dtype)])
                self._rows += grow
        self._ids[slot] = req_id
        self._index[req_id] = slot
        for name, (_, _, fill) in self._spec.items():
            self._cols[name][slot] = fill
        return slot
