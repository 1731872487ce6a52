"""Collectives along mesh dimensions from the controller: t.reduce / t.reduce_ /
podium.reduce on a 4-proc mesh and its views (docs/tensor.md, TE-17)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import podium  # noqa: E402
from podium.actor import this_host  # noqa: E402

T = 60  # seconds: bound on every wait below


@pytest.fixture(scope="module")
def mesh():
    pm = this_host().spawn_procs(per_host={"gpus": 4})
    try:
        yield pm
    finally:
        pm.stop().get(timeout=T)


def _all(t, m):
    """Each proc's value of t, in row-major order of the view m."""
    labels, sizes = list(m.sizes), list(m.sizes.values())
    n = 1
    for s in sizes:
        n *= s
    out = []
    for i in range(n):
        coords, rest = {}, i
        for label, size in zip(reversed(labels), reversed(sizes)):
            coords[label] = rest % size
            rest //= size
        out.append(podium.fetch_shard(t, coords).get(timeout=T).tolist())
    return out


def test_all_reduce_stack_and_scatter_along_one_dim(mesh):  # TE-17
    with mesh.activate():
        r = mesh.rank_tensor("gpus").float()
        x = torch.ones(4) * (r + 1)
        assert _all(x.reduce("gpus", "sum"), mesh) == [[10.0] * 4] * 4
        assert _all(x.reduce("gpus", "avg"), mesh) == [[2.5] * 4] * 4
        assert _all(x.reduce("gpus", "max"), mesh) == [[4.0] * 4] * 4
        stacked = x.reduce("gpus", "stack")
        assert stacked.shape == (4, 4)
        assert podium.inspect(stacked, gpus=2)[:, 0].tolist() == [1.0, 2.0, 3.0, 4.0]
        part = x.reduce("gpus", "sum", scatter=True)
        assert part.shape == ()
        assert _all(part, mesh) == [10.0] * 4
        bits = (mesh.rank_tensor("gpus") + 1).reduce("gpus", "bor")
        assert podium.inspect(bits).item() == 1 | 2 | 3 | 4
        y = x.clone()
        assert y.reduce_("gpus", "sum") is y
        assert _all(y, mesh) == [[10.0] * 4] * 4
        z = podium.reduce({"a": x}, "gpus", "min")["a"]
        assert _all(z, mesh) == [[1.0] * 4] * 4


def test_reduce_along_dims_of_a_split_renamed_and_sliced_mesh(mesh):  # TE-17
    grid = mesh.split(gpus=("dp", "tp"), tp=2).rename(dp="replica")
    with grid.activate():
        rank = grid.rank_tensor(("replica", "tp")).float()  # 0..3
        along_tp = rank.reduce("tp", "sum")  # {0,1} and {2,3}
        assert _all(along_tp, grid) == [1.0, 1.0, 5.0, 5.0]
        along_replica = rank.reduce("replica", "sum")  # {0,2} and {1,3}
        assert _all(along_replica, grid) == [2.0, 4.0, 2.0, 4.0]
        both = rank.reduce(("replica", "tp"), "sum")
        assert _all(both, grid) == [6.0] * 4
        everything = rank.reduce((), "max")
        assert _all(everything, grid) == [3.0] * 4
    row = grid.slice(replica=1)
    with row.activate():
        v = row.rank_tensor("tp").float() + 10
        assert _all(v.reduce("tp", "sum"), row) == [21.0, 21.0]


def test_reduce_to_one_rank(mesh):  # TE-17
    with mesh.activate():
        x = mesh.rank_tensor("gpus").float() + 1
        first = mesh.slice(gpus=0)
        total = x.reduce("gpus", "sum", mesh=first)
        assert total.mesh.sizes == {}
        assert podium.inspect(total).item() == 10.0


def test_bad_reductions_raise_before_anything_is_sent(mesh):  # TE-17
    grid = mesh.split(gpus=("dp", "tp"), tp=2)
    with grid.activate():
        x = torch.ones(2)
        with pytest.raises(KeyError):
            x.reduce("nope")
        with pytest.raises(ValueError, match="twice"):
            x.reduce(("dp", "dp"))
        with pytest.raises(ValueError, match="multiple dimensions"):
            x.reduce(("dp", "tp"), "stack")
        with pytest.raises(ValueError, match="not supported"):
            x.reduce("dp", "median")
        with pytest.raises(ValueError):
            x.reduce("dp", "band")  # bitwise on floats
        with pytest.raises(ValueError):
            torch.ones(3).reduce("dp", "sum", scatter=True)  # 3 rows, a group of 2
        assert _all(x.reduce("dp"), grid) == [[2.0, 2.0]] * 4  # still serving


def _fail_on_rank_1(t):
    if int(t.item()) == 1:
        raise ValueError("failed on purpose on rank 1")
    return t.clone()


def test_a_failed_input_fails_the_reduce_on_every_member(mesh):  # TE-18, TE-2
    with mesh.activate():
        r = mesh.rank_tensor("gpus").float()
        x = podium.remote(_fail_on_rank_1, propagate=lambda t: t.clone())(r)
        y = x.reduce("gpus", "sum")
        for g in range(4):
            with pytest.raises(podium.RemoteException) as e:
                podium.fetch_shard(y, gpus=g).get(timeout=T)
            assert "not done within" not in str(e.value)  # told by rank 1, not timed out
            if g == 1:
                assert "failed on purpose on rank 1" in str(e.value)
        # The workers and the collectives go on.
        assert podium.inspect(r.reduce("gpus", "sum"), gpus=1).item() == 6.0
