"""Actors and tensors together (docs/tensor.md): an endpoint's results as tensor handles
(``endpoint.rref``), and tensor handles passed to endpoints of actors on the same procs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import podium  # noqa: E402
from podium.actor import Actor, ActorError, endpoint, this_host  # noqa: E402

T = 60  # seconds: bound on every wait below


class Holder(Actor):
    """Keeps the tensors it is given; answers with tensors made from its rank."""

    def __init__(self) -> None:
        from podium.actor import current_rank
        self.rank = current_rank().rank
        self.kept = None

    @endpoint(propagate=lambda n: torch.empty(n))
    def ranked(self, n: int) -> "torch.Tensor":
        return torch.full((n,), float(self.rank))

    @endpoint
    def pair(self) -> tuple:  # no propagate: the first proc's result gives the metadata
        return torch.full((2, 3), float(self.rank)), torch.arange(4) + self.rank

    @endpoint(propagate=lambda t: torch.empty(t.shape, dtype=t.dtype))
    def doubled(self, t: "torch.Tensor") -> "torch.Tensor":
        return t * 2

    @endpoint
    def keep(self, t: "torch.Tensor") -> list:
        self.kept = t
        return t.tolist()

    @endpoint
    def kept_now(self) -> list:
        return self.kept.tolist()

    @endpoint
    def is_kept(self, t: "torch.Tensor") -> bool:
        return t is self.kept

    @endpoint(propagate=lambda: torch.empty(2))
    def fails(self) -> "torch.Tensor":
        raise ValueError(f"no tensor from rank {self.rank}")


@pytest.fixture(scope="module")
def setup():
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        actors = pm.spawn("holders", Holder)
        actors.initialized.get(timeout=T)
        yield pm, actors
    finally:
        pm.stop().get(timeout=T)


def test_rref_returns_each_procs_value(setup):  # TE-19
    pm, actors = setup
    with pm.activate():
        t = actors.ranked.rref(3)
        assert isinstance(t, podium.Tensor) and t.shape == (3,) and t.dtype == torch.float32
        assert podium.inspect(t, gpus=0).tolist() == [0.0, 0.0, 0.0]
        assert podium.inspect(t, gpus=1).tolist() == [1.0, 1.0, 1.0]
        # Without propagate: the structure and metadata come from the first proc's result.
        a, b = actors.pair.rref()
        assert a.shape == (2, 3) and b.shape == (4,) and b.dtype == torch.int64
        assert podium.inspect(b, gpus=1).tolist() == [1, 2, 3, 4]
        assert podium.inspect(a + 1, gpus=1).sum().item() == 12.0


def test_rref_is_ordered_with_tensor_ops(setup):  # TE-19
    pm, actors = setup
    with pm.activate():
        x = pm.rank_tensor("gpus").float() * torch.ones(2) + 10
        x.add_(1)  # still in the batch when the endpoint is called: it must see it
        y = actors.doubled.rref(x)
        x.add_(100)  # issued after: the endpoint must not see it
        z = y + x
        assert podium.inspect(y, gpus=0).tolist() == [22.0, 22.0]
        assert podium.inspect(y, gpus=1).tolist() == [24.0, 24.0]
        assert podium.inspect(z, gpus=1).tolist() == [136.0, 136.0]


def test_handle_argument_arrives_as_the_local_tensor(setup):  # TE-20
    pm, actors = setup
    with pm.activate():
        x = pm.rank_tensor("gpus").float() * torch.ones(3)
        x.add_(5)  # not yet sent: the call must run after it
        got = actors.keep.call(x).get(timeout=T)
        assert [got.item(gpus=i) for i in range(2)] == [[5.0] * 3, [6.0] * 3]
        # The actor holds the worker's own tensor: a later in-place op is visible to it.
        x.mul_(2)
        podium.inspect(x, gpus=0)  # the batch runs
        kept = actors.kept_now.call().get(timeout=T)
        assert kept.item(gpus=1) == [12.0] * 3
        same = actors.is_kept.call(x).get(timeout=T)
        assert same.item(gpus=0) and same.item(gpus=1)
        # call_one on one actor, broadcast, and rref take handles too.
        one = actors.slice(gpus=1).keep.call_one(x + 1).get(timeout=T)
        assert one == [13.0] * 3
        actors.keep.broadcast(x - 1)
        assert actors.kept_now.call().get(timeout=T).item(gpus=0) == [9.0] * 3
        y = actors.doubled.rref(x)
        # An rref still queued and a call taking its result, on the same actors: in order.
        assert actors.keep.call(y).get(timeout=T).item(gpus=1) == [24.0] * 3
        assert podium.inspect(y, gpus=1).tolist() == [24.0] * 3


def test_failing_endpoint_poisons_its_outputs(setup):  # TE-19, TE-2
    pm, actors = setup
    with pm.activate():
        bad = actors.fails.rref()
        dependent = bad + 1
        with pytest.raises(podium.RemoteException) as info:
            podium.inspect(dependent, gpus=1)
        assert "no tensor from rank 1" in str(info.value)
        assert info.value.rank == 1
        # The workers and actors live on.
        assert podium.inspect(actors.ranked.rref(2), gpus=1).tolist() == [1.0, 1.0]
        # A failed value passed to an actor fails that call (TE-20).
        with pytest.raises(ActorError, match="no tensor from rank"):
            actors.keep.call(bad).get(timeout=T)


def test_handles_refused_for_actors_on_other_procs(setup):  # TE-20
    pm, actors = setup
    other = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        elsewhere = other.spawn("elsewhere", Holder)
        with pm.activate():
            x = torch.ones(2)
            with pytest.raises(TypeError, match="only be passed to actors spawned on procs"):
                elsewhere.keep.call(x)
            with pytest.raises(ValueError, match="not on the procs of the active mesh"):
                elsewhere.ranked.rref(2)
        # A handle of one proc only cannot go to the actors of both.
        with pm.slice(gpus=0).activate():
            y = torch.zeros(2)
            with pytest.raises(TypeError, match="only be passed to actors spawned on procs"):
                actors.keep.call(y)
            assert actors.slice(gpus=0).keep.call_one(y).get(timeout=T) == [0.0, 0.0]
        with pytest.raises(TypeError, match="cannot be pickled"):
            import pickle
            pickle.dumps(x)
    finally:
        other.stop().get(timeout=T)
