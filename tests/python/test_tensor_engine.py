"""The tensor engine's core on a 4-proc mesh: activation, ops as commands, fetching, batching,
freeing, failures (docs/tensor.md)."""

from __future__ import annotations

import os
import time

import pytest

torch = pytest.importorskip("torch")

import podium  # noqa: E402
from podium.actor import SupervisionError, this_host  # noqa: E402
from podium.tensor import _client, _tensor  # noqa: E402

T = 30  # seconds: bound on every wait below


@pytest.fixture(scope="module")
def mesh():
    pm = this_host().spawn_procs(per_host={"gpus": 4})
    try:
        yield pm
    finally:
        pm.stop().get(timeout=T)


def _wait_for(cond, bound: float = T, what: str = "condition"):
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {bound} s")


def test_ops_run_on_every_proc_in_issue_order(mesh):  # TE-1, TE-14
    with mesh.activate():
        a = torch.ones(2, 3)
        a.add_(mesh.rank_tensor("gpus"))
        b = a * 10
        a.mul_(0)  # after b was computed: b keeps the earlier value
        for g in range(4):
            assert podium.inspect(b, gpus=g).tolist() == [[10.0 * (1 + g)] * 3] * 2
            assert podium.inspect(a, gpus=g).tolist() == [[0.0] * 3] * 2


def test_handles_carry_metadata_not_data(mesh):
    with mesh.activate():
        t = torch.rand(3, 4, dtype=torch.float64)
        assert isinstance(t, podium.Tensor)
        assert t.shape == (3, 4) and t.dtype == torch.float64 and t.device.type == "cpu"
        assert t.mesh.sizes == {"gpus": 4}
        u = t.t()[1:]
        assert u.shape == (3, 3) and isinstance(u, podium.Tensor)
        assert "podium.Tensor(shape=(3, 3)" in repr(u)
        s = t.sum(dim=0, keepdim=True)
        assert s.shape == (1, 4)


def test_outside_the_block_torch_runs_locally(mesh):  # TE-7
    with mesh.activate():
        pass
    x = torch.ones(2) + 1
    assert type(x) is torch.Tensor and torch.equal(x, torch.full((2,), 2.0))
    with pytest.raises(ValueError, match="no device mesh is active"):
        podium.get_active_mesh()
    with mesh.activate():
        assert podium.get_active_mesh() is mesh
        with podium.no_mesh.activate():
            assert type(torch.zeros(1)) is torch.Tensor


def test_a_local_tensor_in_a_remote_op_raises(mesh):  # TE-7
    local = torch.ones(3)
    with mesh.activate():
        remote = torch.ones(3)
        with pytest.raises(TypeError, match="local tensor"):
            torch.add(remote, local)
        with pytest.raises(TypeError):  # operators turn it into "unsupported operand"
            remote + local
        assert (local + local).tolist() == [2.0] * 3  # all local: runs here
        lifted = torch.tensor([1.0, 2.0, 3.0])  # written inside the block: sent as a value
        assert isinstance(lifted, podium.Tensor)
        assert podium.inspect(lifted + remote, gpus=3).tolist() == [2.0, 3.0, 4.0]
        with pytest.raises(RuntimeError, match="podium.inspect"):
            remote.sum().item()


def test_handles_do_not_pickle_and_drop_frees_now(mesh):  # TE-5
    import pickle

    with mesh.activate():
        t = torch.ones(2)
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(t)
        t.drop()
        assert t.dropped
        with pytest.raises(TypeError, match="dropped"):
            torch.add(t, 1)


def test_shape_errors_raise_at_the_call(mesh):
    with mesh.activate():
        with pytest.raises(RuntimeError):
            torch.ones(2, 3) @ torch.ones(2, 3)


def test_repeated_ops_hit_the_meta_cache(mesh):  # TE-6
    with mesh.activate():
        a = torch.ones(8)
        a = a * 2 + 1
        misses = _tensor.cache_stats["misses"]
        for _ in range(50):
            a = a * 2 + 1
        assert _tensor.cache_stats["misses"] == misses
        b = torch.ones(9) * 2  # new shapes: one propagation each
        assert _tensor.cache_stats["misses"] > misses
        assert b.shape == (9,)


def test_inplace_ops_return_the_same_handle(mesh):  # TE-8
    with mesh.activate():
        a = torch.zeros(3)
        assert a.add_(1) is a
        out = torch.empty(3)
        r = torch.add(a, a, out=out)
        assert r is out
        assert podium.inspect(out).tolist() == [2.0] * 3


def test_fetch_shard_is_a_future_of_the_pytree(mesh):  # TE-4
    with mesh.activate():
        r = mesh.rank_tensor("gpus")
        fut = podium.fetch_shard({"r": r, "k": [r * 2, "text"]}, gpus=2)
        value = fut.get(timeout=T)
        assert value["r"].item() == 2 and value["k"][0].item() == 4 and value["k"][1] == "text"
        assert podium.fetch_shard(r).get(timeout=T).item() == 0  # no coordinates: all 0
        assert podium.inspect(r, {"gpus": 3}).item() == 3
        with pytest.raises(KeyError):
            podium.fetch_shard(r, gpus=1, hosts=0)
        with pytest.raises(IndexError):
            podium.inspect(r, gpus=4)


def test_show_prints_the_value(mesh, capsys):  # TE-4
    with mesh.activate():
        podium.show(mesh.rank_tensor("gpus") + 100, gpus=1)
    assert "101" in capsys.readouterr().out


def test_a_batch_travels_as_one_broadcast(mesh):  # TE-3
    with mesh.activate():
        a = torch.ones(4)
        podium.inspect(a)
        client = a._view.client
        before = client.sent_batches
        for _ in range(200):
            a = a + 1
        assert client.sent_batches == before  # nothing sent before a sync point
        assert podium.inspect(a, gpus=3)[0].item() == 201
        assert client.sent_batches == before + 1  # 400 commands, one broadcast


def test_freed_handles_free_the_remote_values(mesh):  # TE-5
    with mesh.activate():
        keep = torch.ones(1)
        podium.inspect(keep)
        workers = keep._view.client.workers
        base = workers.count.call().get(timeout=T).values()
        many = [torch.ones(16) for _ in range(50)]
        podium.inspect(many[0])
        grown = workers.count.call().get(timeout=T).values()
        assert all(g == b + 50 for g, b in zip(grown, base))
        del many
        podium.inspect(keep)  # a sync point sends the deletes
        assert list(workers.count.call().get(timeout=T).values()) == list(base)


def test_a_failed_command_raises_remote_exception_and_workers_live_on(mesh):  # TE-2, TE-4
    with mesh.activate():
        idx = torch.tensor([7])
        bad = torch.ones(3).index_select(0, idx)
        dependent = bad * 2 + 1
        with pytest.raises(podium.RemoteException) as info:
            podium.inspect(dependent, gpus=2)
        e = info.value
        assert e.rank == 2 and e.host
        assert "index" in str(e) and "Traceback" in str(e) and "rank 2" in str(e)
        assert isinstance(e.exception, IndexError)
        assert isinstance(e, podium.actor.ActorError)
        # The workers live on: later commands run, values computed earlier are intact.
        ok = torch.ones(2) * 3
        assert podium.inspect(ok, gpus=2).tolist() == [3.0, 3.0]
        # An in-place op on a failed value keeps the failure; the tensor it reads stays good.
        base = torch.zeros(3)
        base.add_(bad)
        with pytest.raises(podium.RemoteException):
            podium.inspect(base)


def _exit_now(t):
    if int(t.item()) == 1:
        os._exit(3)
    return t.clone()


def test_a_dead_proc_fails_fetches_through_supervision(faults):  # TE-9
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        with pm.activate():
            r = pm.rank_tensor("gpus")
            out = podium.remote(_exit_now, propagate=lambda t: t.clone())(r)
            t0 = time.monotonic()
            with pytest.raises(SupervisionError):
                podium.fetch_shard(out, gpus=1).get(timeout=T)
            assert time.monotonic() - t0 < T
            assert podium.inspect(out, gpus=0).item() == 0  # the live proc still answers
    finally:
        pm.stop().get(timeout=T)


def test_batch_limit_sends_without_a_sync_point(mesh):  # TE-3
    with mesh.activate():
        a = torch.ones(2)
        podium.inspect(a)
        client = a._view.client
        before = client.sent_batches
        for _ in range(_client.BATCH_LIMIT + 10):
            a = a + 1
        assert client.sent_batches >= before + 1
        assert podium.inspect(a)[0].item() == _client.BATCH_LIMIT + 11
