import os

import pytest
from torch.utils.data import DataLoader, Dataset

from detector.data.workers import LOWEST_PRIORITY, worker_init


class _Niceness(Dataset):
    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> int:
        return os.nice(0)  # the calling process's current niceness


@pytest.mark.skipif(not hasattr(os, "nice"), reason="no process priorities on this platform")
def test_workers_yield_to_cpu_compute_and_keep_priority_otherwise():
    loaders = {
        shares: DataLoader(_Niceness(), num_workers=1, worker_init_fn=worker_init(shares_cores_with_compute=shares))
        for shares in (True, False)
    }
    assert next(iter(loaders[True])).item() == LOWEST_PRIORITY
    assert next(iter(loaders[False])).item() == os.nice(0)
