"""The tensor engine beyond single ops: remote functions, rank tensors on mesh views,
to_table, autograd / modules / optimizers, grad_generator, coalescing, streams and borrows,
moving tensors between meshes (docs/tensor.md)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import podium  # noqa: E402
from podium.actor import this_host  # noqa: E402
from podium.tensor import _client, _move  # noqa: E402

T = 30  # seconds: bound on every wait below


@pytest.fixture(scope="module")
def mesh():
    pm = this_host().spawn_procs(per_host={"gpus": 4})
    try:
        yield pm
    finally:
        pm.stop().get(timeout=T)


def _values(t, view_mesh):
    """Every proc's value of `t` (a list in row-major order of `view_mesh`)."""
    labels = list(view_mesh.sizes)
    sizes = list(view_mesh.sizes.values())
    out = []
    n = 1
    for s in sizes:
        n *= s
    for i in range(n):
        coords, rest = {}, i
        for label, size in zip(reversed(labels), reversed(sizes)):
            coords[label] = rest % size
            rest //= size
        out.append(podium.inspect(t, coords).tolist())
    return out


def scale_and_shift(t, k: float):
    return t * k + 1, t.sum()


def test_remote_functions_run_on_every_proc(mesh):  # TE-13
    with mesh.activate():
        r = mesh.rank_tensor("gpus").float()
        a, s = podium.remote(scale_and_shift)(r * torch.ones(2), 10.0)
        assert a.shape == (2,) and s.shape == ()
        assert _values(a, mesh) == [[1.0, 1.0], [11.0, 11.0], [21.0, 21.0], [31.0, 31.0]]
        assert podium.inspect(s, gpus=3).item() == 6.0
        # By import path, with a propagate function giving the outputs' metadata.
        f = podium.remote("torch.Tensor.neg", propagate=lambda t: t)
        assert podium.inspect(f(r), gpus=2).item() == -2.0

        @podium.remote(propagate=lambda t: torch.empty(3, dtype=torch.int64))
        def arange_plus(t):  # defined here: travels by value
            return torch.arange(3) + t.long()

        out = arange_plus(r)
        assert out.shape == (3,) and out.dtype == torch.int64
        assert podium.inspect(out, gpus=1).tolist() == [1, 2, 3]


def positives(t):
    return t[t > 0]  # a shape that depends on the values: fake tensors cannot tell it


def test_remote_propagate_inspect_and_cached(mesh):  # TE-13
    with mesh.activate():
        t = torch.tensor([1.0, -2.0, 3.0, -4.0, 5.0])
        out = podium.remote(positives, propagate="inspect")(t)
        assert out.shape == (3,)
        assert podium.inspect(out, gpus=3).tolist() == [1.0, 3.0, 5.0]
        cached = podium.remote(positives, propagate="cached")
        a, b = cached(t), cached(t * 2)
        assert len(cached._cached) == 1  # the same input metadata: probed once
        assert podium.inspect(b, gpus=1).tolist() == [2.0, 6.0, 10.0]
        assert a.shape == (3,)
        with pytest.raises(podium.RemoteException, match="bad value"):
            podium.remote(_raise_value_error, propagate="inspect")(t)


def _raise_value_error(t):
    raise ValueError("bad value in remote function")


def test_a_failing_remote_function_raises_remote_exception(mesh):  # TE-2, TE-13
    with mesh.activate():
        out = podium.remote(_raise_value_error, propagate=lambda t: t)(torch.ones(1))
        with pytest.raises(podium.RemoteException, match="bad value in remote function") as e:
            podium.inspect(out, gpus=1)
        assert isinstance(e.value.exception, ValueError) and e.value.rank == 1
        assert "_raise_value_error" in str(e.value)


def test_rank_tensors_follow_mesh_views(mesh):  # TE-14
    with mesh.activate():
        ranks = mesh.rank_tensors()
        assert set(ranks) == {"gpus"}
        assert _values(ranks["gpus"], mesh) == [0, 1, 2, 3]
    grid = mesh.split(gpus=("dp", "tp"), tp=2)
    with grid.activate():
        assert _values(grid.rank_tensor("dp"), grid) == [0, 0, 1, 1]
        assert _values(grid.rank_tensor("tp"), grid) == [0, 1, 0, 1]
        assert _values(grid.rank_tensor(("tp", "dp")), grid) == [0, 2, 1, 3]
    renamed = grid.rename(dp="replica")
    with renamed.activate():
        assert _values(renamed.rank_tensor("replica"), renamed) == [0, 0, 1, 1]
        with pytest.raises(KeyError):
            renamed.rank_tensor("dp")
    row = grid.slice(dp=1)
    with row.activate():
        t = row.rank_tensor("tp") + 10
        assert t.mesh.sizes == {"tp": 2}
        assert _values(t, row) == [10, 11]
    flat = grid.flatten("all")
    with flat.activate():
        assert _values(flat.rank_tensor("all"), flat) == [0, 1, 2, 3]


def test_to_table_draws_the_mesh(mesh):
    table = mesh.split(gpus=("dp", "tp"), tp=2).to_table()
    assert "0.gpu[0]" in table and "0.gpu[3]" in table and "tp" in table
    assert table.count("gpu[") == 4


def _train(model, opt, xs, ys, steps):
    for _ in range(steps):
        opt.zero_grad()
        loss = ((model(xs) - ys) ** 2).mean()
        loss.backward()
        opt.step()
    return loss


def test_autograd_modules_and_optimizers_run_on_the_workers(mesh):  # TE-8
    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 2)
    xs = torch.randn(8, 4)
    ys = torch.randn(8, 2)
    w0, b0 = ref.weight.detach().clone(), ref.bias.detach().clone()
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    expected = _train(ref, opt_ref, xs, ys, 5).item()
    with mesh.activate():
        model = torch.nn.Linear(4, 2)
        assert isinstance(model.weight, podium.Tensor)
        assert isinstance(model.weight, torch.nn.Parameter)
        with torch.no_grad():
            model.weight.copy_(torch.tensor(w0.tolist()))
            model.bias.copy_(torch.tensor(b0.tolist()))
        rx, ry = torch.tensor(xs.tolist()), torch.tensor(ys.tolist())
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        loss = _train(model, opt, rx, ry, 5)
        assert isinstance(model.weight.grad, podium.Tensor)
        for g in range(4):
            got_w = podium.inspect(model.weight, gpus=g)
            assert torch.allclose(got_w, ref.weight.detach(), atol=1e-5)
        assert abs(podium.inspect(loss, gpus=3).item() - expected) < 1e-5


def test_grad_generator_yields_gradients_last_first(mesh):  # TE-15
    with mesh.activate():
        a = torch.ones(3, requires_grad=True)
        b = torch.ones(2, requires_grad=True)
        loss = (a * 2).sum() + (b * 5).sum()
        grads = list(podium.grad_generator(loss, [a, b]))
        assert [g.shape for g in grads] == [(2,), (3,)]
        assert podium.inspect(grads[0]).tolist() == [5.0, 5.0]
        assert podium.inspect(grads[1]).tolist() == [2.0, 2.0, 2.0]


def test_coalescing_holds_every_command_until_the_block_ends(mesh):  # TE-12
    with mesh.activate():
        a = torch.ones(1)
        podium.inspect(a)
        client = a._view.client
        before = client.sent_batches
        with podium.coalescing():
            for _ in range(_client.BATCH_LIMIT + 50):
                a = a + 1
            assert client.sent_batches == before
        assert client.sent_batches == before + 1
        assert podium.inspect(a).item() == _client.BATCH_LIMIT + 51


def test_streams_order_and_borrows(mesh):  # TE-10, TE-11
    other = podium.Stream("other")
    assert podium.get_active_stream().name == "main"
    with mesh.activate():
        t = torch.ones(4)
        with other.activate():
            assert podium.get_active_stream() is other
            with pytest.raises(TypeError, match="borrow"):
                torch.add(t, 1)  # t belongs to main
            made_here = torch.zeros(2) + 5
        # Immutable borrow: both streams read; nobody writes t.
        b, borrow = other.borrow(t)
        with other.activate():
            doubled = b * 2
        assert podium.inspect(t + 0).tolist() == [1.0] * 4
        with pytest.raises(TypeError, match="cannot be mutated"):
            t.add_(1)
        borrow.drop()
        t.add_(1)
        with other.activate():
            with pytest.raises(TypeError, match="dropped"):
                torch.add(b, 1)
            assert podium.inspect(doubled).tolist() == [2.0] * 4
            assert podium.inspect(made_here).tolist() == [5.0, 5.0]
        # Mutable borrow: the owner cannot even read until it is dropped.
        m, mborrow = other.borrow(t, mutable=True)
        with other.activate():
            m.mul_(10)
        with pytest.raises(TypeError, match="mutably borrowed"):
            torch.add(t, 1)
        mborrow.drop()
        assert podium.inspect(t).tolist() == [20.0] * 4


def test_to_mesh_moves_values_between_slices(mesh):  # TE-16
    grid = mesh.split(gpus=("stage", "dp"), dp=2)
    first, second = grid.slice(stage=0), grid.slice(stage=1)
    with first.activate():
        x = first.rank_tensor("dp").float() * torch.ones(3) + 100
    moved = x.to_mesh(second)
    assert moved.mesh.sizes == {"dp": 2}
    with second.activate():
        y = moved + 1
        assert _values(y, second) == [[101.0] * 3, [102.0] * 3]
    # A dimension only the destination has: the value is broadcast along it.
    with pytest.warns(UserWarning, match="broadcasting"):
        z = x.slice_mesh(dp=1).to_mesh(second)
    with second.activate():
        assert _values(z, second) == [[101.0] * 3, [101.0] * 3]
    with pytest.raises(ValueError, match="does not have dimensions"):
        x.to_mesh(second.slice(dp=0))


def test_to_mesh_moves_large_values_over_rdma(mesh):  # TE-16
    grid = mesh.split(gpus=("stage", "dp"), dp=2)
    first, second = grid.slice(stage=0), grid.slice(stage=1)
    n = _move.LARGE // 4 + 1000  # float32 elements: over the threshold
    with first.activate():
        x = torch.arange(n, dtype=torch.float32) + first.rank_tensor("dp").float()
    y = podium.to_mesh(x, second)
    with second.activate():
        total = y.sum()
        for dp in range(2):
            expected = n * (n - 1) / 2 + dp * n
            assert abs(podium.inspect(total, dp=dp).item() - expected) / expected < 1e-5
        tail = y[-3:]
        assert podium.inspect(tail, dp=1).tolist() == [n - 2.0, n - 1.0, float(n)]


def test_to_mesh_moves_values_to_another_proc_mesh(mesh):  # TE-16
    other = this_host().spawn_procs(per_host={"dp": 2})
    try:
        grid = mesh.split(gpus=("stage", "dp"), dp=2)
        first = grid.slice(stage=1)
        n = _move.LARGE // 4 + 10
        with first.activate():
            small = first.rank_tensor("dp").float() + 7
            large = torch.ones(n) * (first.rank_tensor("dp").float() + 1)
        s2, l2 = podium.to_mesh((small, large), other)
        assert s2.mesh is other
        with other.activate():
            assert _values(s2, other) == [7.0, 8.0]
            total = l2.sum()
            assert [podium.inspect(total, dp=d).item() for d in range(2)] == [n * 1.0, n * 2.0]
    finally:
        other.stop().get(timeout=T)
