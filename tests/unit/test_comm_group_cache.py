"""The ``group`` scalar's cache (``_checks.GROUPS``): the serving form's fast path must not hand a
kernel a process group that was destroyed, or an old group whose name a new group now has."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from opmux.kernels.ops import _checks, comm
from opmux.kernels.ops.comm import _contracts


def _init() -> str:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    assert dist.group.WORLD is not None
    return str(dist.group.WORLD.group_name)


@pytest.fixture
def fresh_dist():  # type: ignore[no-untyped-def]
    if dist.is_initialized():
        pytest.skip("this process already has a default group")
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_a_destroyed_group_is_not_served_from_the_cache(fresh_dist: None) -> None:
    name = _init()
    comm.all_reduce(torch.ones(2, 4), name)  # resolves the name, fills the cache
    dist.destroy_process_group()
    with pytest.raises(ValueError, match=r"names no (live )?process group"):
        comm.all_reduce(torch.ones(2, 4), name)


def test_a_reused_name_resolves_to_the_new_group(fresh_dist: None) -> None:
    name = _init()
    comm.all_reduce(torch.ones(2, 4), name)
    old = _checks.GROUPS[name]
    dist.destroy_process_group()
    assert _init() == name  # the default group's name again
    args, _ = _contracts.check_all_reduce("comm.all_reduce", torch.ones(2, 4), name)
    assert args[2] is dist.group.WORLD and args[2] is not old
