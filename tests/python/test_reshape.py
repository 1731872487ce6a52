"""split, flatten, rename on HostMesh, ProcMesh, ActorMesh and ValueMesh, computed by the C++
ndslice Region (API.md "Meshes")."""

from __future__ import annotations

import pytest

from podium.actor import Actor, current_rank, current_size, endpoint, this_host, ValueMesh

T = 10  # seconds: bound on every get() below


class Where(Actor):
    @endpoint
    def where(self):
        return current_rank().rank, current_size(), dict(current_rank())


def test_value_mesh_split_flatten_rename():
    vm = ValueMesh._from_values(["hosts", "gpus"], [2, 4], list(range(8)))
    split = vm.split(gpus=("node", "dev"), dev=2)
    assert split.sizes == {"hosts": 2, "node": 2, "dev": 2}
    assert list(split.values()) == list(range(8))  # same ranks, same order
    assert split.item(hosts=1, node=1, dev=0) == 6
    inferred = vm.split(hosts=("a", "b"), a=1)
    assert inferred.sizes == {"a": 1, "b": 2, "gpus": 4}
    flat = vm.flatten("r")
    assert flat.sizes == {"r": 8} and flat.slice(r=5).item() == 5
    renamed = vm.rename(hosts="dp", gpus="tp")
    assert renamed.sizes == {"dp": 2, "tp": 4} and renamed.item(dp=1, tp=3) == 7
    # A slice keeps its values through reshaping.
    sub = vm.slice(gpus=slice(1, 3))
    assert list(sub.rename(gpus="g").values()) == [1, 2, 5, 6]
    assert list(sub.split(hosts=("x", "y"), x=1).values()) == [1, 2, 5, 6]
    evens = vm.slice(gpus=slice(0, 4, 2))  # base ranks 0, 2, 4, 6: evenly spaced
    assert list(evens.flatten("x").values()) == [0, 2, 4, 6]


def test_reshape_errors():
    vm = ValueMesh._from_values(["hosts", "gpus"], [2, 4], list(range(8)))
    with pytest.raises(ValueError):
        vm.split(gpus=("a", "b"), a=3)  # 3 does not divide 4
    with pytest.raises(ValueError):
        vm.split(gpus=("a", "b"))  # two sizes to infer
    with pytest.raises(ValueError):
        vm.split(cpus=("a", "b"))  # no such dimension
    with pytest.raises(ValueError):
        vm.split(gpus=("a", "b"), a=2, c=2)  # a size for no new dimension
    with pytest.raises(ValueError):
        vm.split(gpus="ab")
    with pytest.raises(ValueError):
        vm.rename(cpus="x")
    with pytest.raises(ValueError):
        vm.rename(hosts="gpus")  # the name is taken
    with pytest.raises(ValueError):
        vm.slice(gpus=slice(1, 3)).flatten("r")  # base ranks 1, 2, 5, 6: not evenly spaced


def test_actor_mesh_reshaped_calls_see_the_new_shape(spawn, new_procs):
    pm = new_procs(hosts=1, gpus=4)
    mesh = spawn(Where, on=pm)
    flat = mesh.flatten("r")
    assert flat.sizes == {"r": 4}
    vm = flat.where.call().get(timeout=T)
    assert [r for r, _, _ in vm.values()] == [0, 1, 2, 3]
    assert all(size == {"r": 4} for _, size, _ in vm.values())
    split = mesh.split(gpus=("node", "dev"), dev=2)
    assert split.sizes == {"hosts": 1, "node": 2, "dev": 2}
    assert split.slice(node=1, dev=0).where.call_one().get(timeout=T)[1] == {"hosts": 1}
    points = [p for _, _, p in split.where.call().get(timeout=T).values()]
    assert points[3] == {"hosts": 0, "node": 1, "dev": 1}
    renamed = mesh.rename(gpus="tp")
    assert renamed.where.call().get(timeout=T).item(hosts=0, tp=2)[2] == {"hosts": 0, "tp": 2}
    # The same actors answer, whatever the shape.
    assert sorted(r for r, _, _ in flat.where.call().get(timeout=T).values()) == [0, 1, 2, 3]


def test_proc_mesh_reshaped_spawns_with_the_new_shape(spawn, new_procs):
    pm = new_procs(gpus=4)
    split = pm.split(gpus=("node", "dev"), node=2)
    assert split.sizes == {"node": 2, "dev": 2} and len(split) == 4
    mesh = spawn(Where, on=split)
    assert mesh.sizes == {"node": 2, "dev": 2}
    assert mesh.where.call().get(timeout=T).item(node=1, dev=1)[2] == {"node": 1, "dev": 1}
    assert pm.rename(gpus="g").sizes == {"g": 4}
    assert pm.flatten("all").sizes == {"all": 4}


def test_host_mesh_reshape_and_spawn(new_procs):
    host = this_host()
    assert host.sizes == {}
    hosts = host.flatten("hosts")
    assert hosts.sizes == {"hosts": 1}
    assert hosts.rename(hosts="h").sizes == {"h": 1}
    pm = hosts.spawn_procs(per_host={"gpus": 2})
    try:
        assert pm.sizes == {"hosts": 1, "gpus": 2}
        pm.initialized.get(timeout=T)
    finally:
        pm.stop().get(timeout=T)
