"""verl integration tests: run by `make test-verl` in .venv-verl. Where verl is not installed
every module skips itself (`pytest.importorskip("verl")` on its first line), so nothing here
imports verl at module level.

Ray is never started. The transfer queue is replaced by an in-memory key-value store with the
four calls verl's replay buffer and batch padding make (kv_list, kv_batch_get, kv_batch_put,
kv_clear), so verl's own sampling and padding code runs unchanged on top of it.
"""

from typing import Any

import pytest


class FakeTransferQueue:
    """partition -> key -> (tag, fields of one sample), with transfer_queue's KV signatures."""

    def __init__(self) -> None:
        self.tags: dict[str, dict[str, dict]] = {}
        self.fields: dict[str, dict[str, dict[str, Any]]] = {}

    def kv_list(self, partition_id: str | None = None) -> dict[str, dict[str, dict]]:
        ids = [partition_id] if partition_id is not None else list(self.tags)
        return {pid: {key: dict(tag) for key, tag in self.tags.get(pid, {}).items()} for pid in ids}

    def kv_batch_put(self, keys: list[str], partition_id: str, fields: Any = None,
                     tags: list[dict] | None = None) -> None:
        for i, key in enumerate(keys):
            self.tags.setdefault(partition_id, {}).setdefault(key, {}).update(tags[i] if tags else {})
            row = self.fields.setdefault(partition_id, {}).setdefault(key, {})
            if fields is not None:
                row.update({name: _sample(fields.get(name), i) for name in fields.keys()})

    def kv_batch_get(self, keys: list[str], partition_id: str, select_fields: list[str] | None = None) -> Any:
        """A TensorDict, built by verl's own helper: jagged tensors for ragged fields, as the real store returns."""
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        rows = []
        for key in keys:
            row = self.fields[partition_id][key]
            names = select_fields if select_fields is not None else list(row)
            missing = [name for name in names if name not in row]
            if missing:  # what the real store says about a field a sample does not have
                raise ValueError(f"field(s) {missing} missing for key {key!r}")
            rows.append({name: row[name] for name in names})
        return list_of_dict_to_tensordict(rows)

    def kv_clear(self, keys: list[str] | str, partition_id: str) -> None:
        for key in [keys] if isinstance(keys, str) else keys:
            self.tags.get(partition_id, {}).pop(key, None)
            self.fields.get(partition_id, {}).pop(key, None)


def _sample(column: Any, i: int) -> Any:
    """Sample i of a TensorDict column: a tensor (dense or jagged) or a non-tensor value."""
    import torch
    from tensordict import NonTensorData, NonTensorStack

    if isinstance(column, NonTensorStack):
        return column.tolist()[i]
    if isinstance(column, NonTensorData):
        return column.data
    if isinstance(column, torch.Tensor):
        return column.unbind(0)[i].clone()
    raise TypeError(f"unexpected column type {type(column)}")


@pytest.fixture
def fake_tq(monkeypatch: pytest.MonkeyPatch) -> FakeTransferQueue:
    import transfer_queue

    store = FakeTransferQueue()
    for name in ("kv_list", "kv_batch_put", "kv_batch_get", "kv_clear"):
        monkeypatch.setattr(transfer_queue, name, getattr(store, name))
    return store
