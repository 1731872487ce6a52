"""Collectives along mesh dimensions (podium.tensor._collectives, docs/collectives.md): an actor
on a real proc mesh calls the library directly, as the tensor engine's worker does."""

from __future__ import annotations

import os
import signal
import time

import pytest

torch = pytest.importorskip("torch")

from podium.actor import Actor, endpoint, this_host  # noqa: E402
from podium.tensor._collectives import (  # noqa: E402
    Communicator,
    wait_values,
    members_along,
    reduce_meta,
    spawn_store,
)
from podium._src.shape import ValueMesh  # noqa: E402

T = 60  # bound on every get() below


class Member(Actor):
    """Reduces what it is given with this proc's Communicator."""

    def __init__(self, store, namespace: str, timeout_s: "float | None" = 30.0) -> None:
        Communicator.configure(store, namespace=namespace, timeout_s=timeout_s)

    @endpoint
    def reduce(self, members, reduction, scatter, inplace, data, dtype="float32", root=None):
        t = torch.tensor(data, dtype=getattr(torch, dtype))
        before = t.clone()
        out = Communicator.get().reduce(t, members=tuple(members), reduction=reduction,
                                        scatter=scatter, inplace=inplace, root=root)
        if out is None:
            return None, None, torch.equal(t, before)  # not the root: nothing, t untouched
        return out.tolist(), str(out.dtype), out is t

    @endpoint
    def two_groups(self, first, second) -> list:
        """Reduces over ``first`` and, 0.3 s later, ``second``, on two threads of their own
        (as two streams would); both results."""
        import threading

        Communicator.get().rank  # learnt from this actor's context, before the threads
        out = [None, None]

        def run(i, members):
            try:
                out[i] = Communicator.get().reduce(torch.ones(1), members=tuple(members),
                                                   reduction="sum", scatter=False,
                                                   inplace=False).tolist()
            except Exception as e:  # reported to the test
                out[i] = repr(e)

        threads = [threading.Thread(target=run, args=(0, first))]
        threads[0].start()
        time.sleep(0.3)
        threads.append(threading.Thread(target=run, args=(1, second)))
        threads[1].start()
        for th in threads:
            th.join(T)
        return out

    @endpoint
    def rank(self) -> int:
        return Communicator.get().rank

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def listening(self) -> list:
        """(address, port) of every TCP socket of this process in the LISTEN state."""
        inodes = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        out = []
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as f:
                for line in f.readlines()[1:]:
                    cols = line.split()
                    if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                        addr, port = cols[1].split(":")
                        out.append((addr, int(port, 16)))
        return out


@pytest.fixture(scope="module")
def mesh4():
    """Four procs as a 2x2 mesh {"x": 2, "y": 2}."""
    pm = this_host().spawn_procs(per_host={"x": 2, "y": 2})
    try:
        pm.initialized.get(timeout=T)
        yield pm
    finally:
        pm.stop().get(timeout=T)


@pytest.fixture(scope="module")
def store():
    return spawn_store()


@pytest.fixture
def members4(spawn, mesh4, store):
    return spawn(Member, store, "mesh4", on=mesh4)


@pytest.fixture
def members2(spawn, procs, store):
    return spawn(Member, store, "mesh2", on=procs)


class Bare(Actor):
    """Uses the Communicator's defaults: no configure()."""

    @endpoint
    def defaults(self) -> tuple:
        c = Communicator.get()
        return c.rank, c.namespace

    @endpoint
    def reduce(self, members) -> list:
        return Communicator.get().reduce(torch.ones(1), members=tuple(members), reduction="sum",
                                         scatter=False, inplace=False).tolist()


def _points(mesh):
    e = mesh._region.extent
    return [dict(zip(e.labels, e.point_of_rank(r).coords)) for r in range(e.num_ranks)]


def _reduce_along(actors, view, dims, reduction, scatter=False, inplace=False, data=None,
                  dtype="float32", root=None):
    """Every proc of ``view`` reduces data(global_rank) along dims; results by view rank.
    root(members) picks a group's root."""
    base = view._region.base_ranks()
    args = []
    for p, g in zip(_points(view), base):
        members = members_along(view, dims, g)
        r = None if root is None else root(members)
        args.append((g, (list(members), reduction, scatter, inplace, data(g), dtype, r)))
    # the actors are addressed on the root mesh by global rank
    root_points = {g: p for g, p in zip(range(len(_points(actors))), _points(actors))}
    futs = [actors.slice(**root_points[g]).reduce.call_one(*a) for g, a in args]
    return [f.get(timeout=T) for f in futs]


# --- every reduction, 4 procs along one flattened dimension ----------------------------------


def test_every_reduction_over_four_procs(members4, mesh4):  # CO-1, CO-3
    flat = mesh4.flatten("all")
    data = lambda g: [float(g + 1), float(2 * g - 3)]  # noqa: E731
    expect = {
        "sum": [10.0, 0.0], "avg": [2.5, 0.0], "product": [24.0, 9.0],
        "min": [1.0, -3.0], "max": [4.0, 3.0],
    }
    for reduction, want in expect.items():
        results = _reduce_along(members4, flat, "all", reduction, data=data)
        assert [r[0] for r in results] == [want] * 4, reduction
    ints = lambda g: [g + 1, 6 + g]  # noqa: E731  1..4 and 6..9
    for reduction, want in {"band": [0, 6 & 7 & 8 & 9], "bor": [7, 6 | 7 | 8 | 9],
                            "bxor": [1 ^ 2 ^ 3 ^ 4, 6 ^ 7 ^ 8 ^ 9]}.items():
        results = _reduce_along(members4, flat, "all", reduction, data=ints, dtype="int64")
        assert [r[0] for r in results] == [want] * 4, reduction
        assert results[0][1] == "torch.int64"


def test_scatter_stack_and_all_to_all(members4, mesh4):  # CO-2
    flat = mesh4.flatten("all")
    rows = lambda g: [[float(10 * g + j)] for j in range(4)]  # noqa: E731  shape (4, 1)
    # reduce-scatter: member i gets the sum of everyone's row i, without the first dimension
    results = _reduce_along(members4, flat, "all", "sum", scatter=True, data=rows)
    assert [r[0] for r in results] == [[float(60 + 4 * i)] for i in range(4)]
    # all-gather: every member gets everyone's tensor, stacked in group order
    results = _reduce_along(members4, flat, "all", "stack", data=lambda g: [float(g)])
    assert [r[0] for r in results] == [[[0.0], [1.0], [2.0], [3.0]]] * 4
    # all-to-all: member i gets row i of everyone, stacked
    results = _reduce_along(members4, flat, "all", "stack", scatter=True, data=rows)
    assert [r[0] for r in results] == [[[float(10 * j + i)] for j in range(4)]
                                       for i in range(4)]


def test_inplace_writes_the_input(members4, mesh4):
    results = _reduce_along(members4, mesh4.flatten("all"), "all", "sum", inplace=True,
                            data=lambda g: [float(g)])
    assert all(r == ([6.0], "torch.float32", True) for r in results)


def test_two_procs(members2, procs):
    results = _reduce_along(members2, procs, "gpus", "max", data=lambda g: [float(g), -g])
    assert [r[0] for r in results] == [[1.0, 0.0]] * 2
    results = _reduce_along(members2, procs, "gpus", "stack", data=lambda g: [g], dtype="int32")
    assert [r[0] for r in results] == [[[0], [1]]] * 2


# --- dimensions of a 2x2 mesh, after rename, split and slice ---------------------------------


def test_one_and_two_dims_of_a_2x2_mesh(members4, mesh4):  # CO-1
    data = lambda g: [float(g)]  # noqa: E731  global ranks: x*2 + y
    along_x = _reduce_along(members4, mesh4, "x", "sum", data=data)
    assert [r[0] for r in along_x] == [[2.0], [4.0], [2.0], [4.0]]  # y=0: 0+2, y=1: 1+3
    along_y = _reduce_along(members4, mesh4, "y", "sum", data=data)
    assert [r[0] for r in along_y] == [[1.0], [1.0], [5.0], [5.0]]
    both = _reduce_along(members4, mesh4, ("x", "y"), "sum", data=data)
    assert [r[0] for r in both] == [[6.0]] * 4
    stacked = _reduce_along(members4, mesh4, "x", "stack", data=data)
    assert [r[0] for r in stacked] == [[[0.0], [2.0]], [[1.0], [3.0]]] * 2


def test_after_rename_split_and_slice(members4, mesh4):  # CO-1
    data = lambda g: [float(g)]  # noqa: E731
    renamed = mesh4.rename(x="dp", y="tp")
    assert [r[0] for r in _reduce_along(members4, renamed, "dp", "sum", data=data)] == \
        [[2.0], [4.0], [2.0], [4.0]]
    split = mesh4.flatten("all").split(all=("a", "b"), b=2)
    assert [r[0] for r in _reduce_along(members4, split, "b", "sum", data=data)] == \
        [[1.0], [1.0], [5.0], [5.0]]
    row = mesh4.slice(x=1)  # ranks 2 and 3: only they take part
    assert [r[0] for r in _reduce_along(members4, row, "y", "sum", data=data)] == [[5.0]] * 2
    col = mesh4.slice(y=slice(1, 2))  # ranks 1 and 3, x kept
    assert [r[0] for r in _reduce_along(members4, col, "x", "sum", data=data)] == [[4.0]] * 2


def test_reduce_to_one_rank(members4, mesh4):
    """The engine's reduce / gather to one rank (``mesh=`` a sub-mesh): only the root gets the
    result; the others get None and their input stays as it was, even in place."""
    data = lambda g: [float(g + 1)]  # noqa: E731
    flat = mesh4.flatten("all")
    results = _reduce_along(members4, flat, "all", "sum", data=data, root=lambda m: m[2])
    assert results == [(None, None, True), (None, None, True), ([10.0], "torch.float32", False),
                       (None, None, True)]
    results = _reduce_along(members4, flat, "all", "stack", data=data, root=lambda m: m[0])
    assert results[0][0] == [[1.0], [2.0], [3.0], [4.0]]
    assert [r[0] for r in results[1:]] == [None] * 3
    # along x of the 2x2 mesh, in place, to the x=0 member of each group
    results = _reduce_along(members4, mesh4, "x", "avg", inplace=True, data=data,
                            root=lambda m: m[0])
    # roots 0 and 1 hold the averages; ranks 2 and 3 get their own t back, unchanged
    assert results == [([2.0], "torch.float32", True), ([3.0], "torch.float32", True),
                       ([3.0], "torch.float32", True), ([4.0], "torch.float32", True)]


def test_two_groups_built_in_opposite_orders_on_two_threads(spawn, procs, store):  # CO-3
    """Building a group waits for its members; proc 0 builds (0, 1) then (1, 0) while proc 1
    builds them the other way round: each group waits only for its own members."""
    actors = spawn(Member, store, "two-groups", 20.0, on=procs)
    f0 = actors.slice(gpus=0).two_groups.call_one([0, 1], [1, 0])
    f1 = actors.slice(gpus=1).two_groups.call_one([1, 0], [0, 1])
    assert f0.get(timeout=T) == [[2.0], [2.0]]
    assert f1.get(timeout=T) == [[2.0], [2.0]]


def test_defaults_without_configure(spawn, new_procs):  # CO-3
    """Without configure(): the controller's store, the rank in the root mesh, and one
    namespace per root mesh (the same ranks of two meshes never meet in one group)."""
    a, b = new_procs(gpus=2), new_procs(gpus=2)
    on_a, on_b = spawn(Bare, on=a), spawn(Bare, on=b)
    da = sorted(on_a.defaults.call().get(timeout=T).values())
    db = sorted(on_b.defaults.call().get(timeout=T).values())
    assert [r for r, _ in da] == [0, 1] and [r for r, _ in db] == [0, 1]
    assert da[0][1] == da[1][1] and db[0][1] == db[1][1] and da[0][1] != db[0][1]
    assert da[0][1]  # not empty
    futs = [m.reduce.call([0, 1]) for m in (on_a, on_b)]
    assert [sorted(f.get(timeout=T).values()) for f in futs] == [[[2.0], [2.0]]] * 2


def test_rank_comes_from_the_actors_proc(spawn, mesh4, store):
    """Without configure(rank=), a proc's rank is its rank in the root mesh, also for actors
    spawned on a slice."""
    row = spawn(Member, store, "mesh4", on=mesh4.slice(x=1))
    assert sorted(row.rank.call().get(timeout=T).values()) == [2, 3]


def test_rendezvous_goes_through_the_store_and_gloo_listens_on_loopback(members4, mesh4,
                                                                        store):  # CO-4
    results = _reduce_along(members4, mesh4, "y", "sum", data=lambda g: [1.0])
    assert [r[0] for r in results] == [[2.0]] * 4
    assert store.num_keys.call_one().get(timeout=T) > 0  # the groups met in the store
    for g in range(2):
        listening = members4.slice(x=1, y=g).listening.call_one().get(timeout=T)
        # 0100007F: 127.0.0.1 as /proc/net/tcp writes it; nothing on another address
        assert listening and all(addr == "0100007F" for addr, _ in listening), listening


def test_a_wait_for_keys_is_answered_by_the_set_of_the_last_one(store):  # CO-9
    ns = f"co9-{os.getpid()}-{time.monotonic_ns()}"
    keys = [f"{ns}/a", f"{ns}/b"]
    waiting = store.wait_values.call_one(keys, 30.0)
    store.set.call_one(keys[0], b"1").get(timeout=T)
    store.num_keys.call_one().get(timeout=T)  # the store handled every call before this one
    assert not waiting.done(), "answered before its last key was set"
    store.multi_set.call_one([keys[1]], [b"2"]).get(timeout=T)
    assert waiting.get(timeout=T) == [b"1", b"2"]
    assert wait_values(store, keys, 5.0) == [b"1", b"2"], "all set: answered at once"
    with pytest.raises(TimeoutError, match="not set within"):
        wait_values(store, [f"{ns}/never"], 0.3)
    # The forgotten wait is harmless: a later set of that key answers nobody, and serves.
    store.set.call_one(f"{ns}/never", b"late").get(timeout=T)
    assert wait_values(store, [f"{ns}/never"], 5.0) == [b"late"]


# --- refusals and failures ---------------------------------------------------------------------


def test_bad_input_is_refused_and_the_proc_still_serves(members4, mesh4):  # CO-2, CO-6
    flat = mesh4.flatten("all")
    one = members4.slice(x=0, y=0)
    members = list(members_along(flat, "all", 0))
    for args in [
        (members, "band", False, False, [1.0], "float32"),   # bitwise on floats
        (members, "sum", True, False, [1.0, 2.0, 3.0], "float32"),  # 3 rows for 4 members
        (members, "median", False, False, [1.0], "float32"),  # unknown reduction
        (members, "sum", True, True, [[1.0]] * 4, "float32"),  # scatter in place
        (members, "sum", True, False, [[1.0]] * 4, "float32", 0),  # scatter to one rank
        (members, "sum", False, False, [1.0], "float32", 7),  # a root outside the group
        ([1, 2, 3], "sum", False, False, [1.0], "float32"),  # rank 0 not a member
    ]:
        with pytest.raises(Exception) as info:
            one.reduce.call_one(*args).get(timeout=T)
        assert "ValueError" in str(info.value) or isinstance(info.value, ValueError), args
    # nothing was sent: every proc still runs collectives
    results = _reduce_along(members4, flat, "all", "sum", data=lambda g: [1.0])
    assert [r[0] for r in results] == [[4.0]] * 4


def test_a_killed_member_fails_the_others_in_bounded_time(spawn, new_procs, store):  # CO-5
    pm = new_procs(gpus=4)
    actors = spawn(Member, store, "killed", 8.0, on=pm)
    members = [0, 1, 2, 3]
    ok = [actors.slice(gpus=g).reduce.call_one(members, "sum", False, False, [1.0])
          for g in range(4)]
    assert [f.get(timeout=T)[0] for f in ok] == [[4.0]] * 4  # the group is up
    pid = actors.slice(gpus=3).pid.call_one().get(timeout=T)
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    futs = [actors.slice(gpus=g).reduce.call_one(members, "sum", False, False, [1.0])
            for g in range(3)]
    for f in futs:
        with pytest.raises(Exception) as info:
            f.get(timeout=T)
        text = str(info.value)
        assert "CollectiveError" in text and "gloo[0, 1, 2, 3]" in text
        assert "ranks [3]" in text, text
    assert time.monotonic() - start < T  # bounded: get(timeout=T) would have raised first


def test_a_member_that_never_calls_fails_the_others(spawn, new_procs, store):  # CO-5
    pm = new_procs(gpus=2)
    actors = spawn(Member, store, "absent", 2.0, on=pm)
    with pytest.raises(Exception) as info:
        actors.slice(gpus=0).reduce.call_one([0, 1], "sum", False, False, [1.0]).get(timeout=T)
    text = str(info.value)
    assert "CollectiveError" in text and "ranks [1]" in text and "gloo[0, 1]" in text
    # the proc still serves, and once both call the group forms anew
    futs = [actors.slice(gpus=g).reduce.call_one([0, 1], "sum", False, False, [2.0])
            for g in range(2)]
    assert [f.get(timeout=T)[0] for f in futs] == [[4.0]] * 2


def test_the_timeout_comes_from_podium_config(spawn, new_procs, store):  # CO-5
    from podium import config

    pm = new_procs(gpus=2)
    with config.configured(collective_timeout="2s"):
        actors = spawn(Member, store, "configured", None, on=pm)
        with pytest.raises(Exception) as info:
            actors.slice(gpus=0).reduce.call_one([0, 1], "sum", False, False, [1.0]).get(
                timeout=T)
    assert "waited 2 s for ranks [1]" in str(info.value)
    with pytest.raises(ValueError):
        config.configure(collective_timeout="0s")


# --- pure functions -----------------------------------------------------------------------------


def _view(labels, sizes):
    return ValueMesh._from_values(labels, sizes, list(range(_prod(sizes))))


def _prod(xs):
    n = 1
    for x in xs:
        n *= x
    return n


def test_members_along_views():  # CO-1
    m = _view(["x", "y"], [2, 3])
    assert members_along(m, "y", 4) == (3, 4, 5)
    assert members_along(m, "x", 4) == (1, 4)
    assert members_along(m, ("y", "x"), 4) == (0, 1, 2, 3, 4, 5)
    assert members_along(m, (), 0) == (0, 1, 2, 3, 4, 5)
    r = m.rename(x="dp")
    assert members_along(r, "dp", 2) == (2, 5)
    s = m.flatten("all").split(all=("a", "b"), b=2)  # a=3, b=2
    assert members_along(s, "b", 3) == (2, 3)
    assert members_along(s, "a", 3) == (1, 3, 5)
    sl = m.slice(y=slice(0, 3, 2))  # columns 0 and 2
    assert members_along(sl, "y", 5) == (3, 5)
    assert members_along(sl, "x", 2) == (2, 5)
    one = m.slice(x=1)
    assert members_along(one, "y", 3) == (3, 4, 5)
    with pytest.raises(KeyError):
        members_along(m, "z", 0)
    with pytest.raises(ValueError):
        members_along(m, ("x", "x"), 0)
    with pytest.raises(ValueError):
        members_along(one, "y", 0)  # rank 0 is not in the slice


def test_reduce_meta_shapes_and_refusals():  # CO-2
    f, i = torch.float32, torch.int32
    assert reduce_meta((4, 3), f, 4, "sum", False) == ((4, 3), f)
    assert reduce_meta((4, 3), f, 4, "sum", True) == ((3,), f)
    assert reduce_meta((4, 3), f, 4, "stack", False) == ((4, 4, 3), f)
    assert reduce_meta((4, 3), f, 4, "stack", True) == ((4, 3), f)
    assert reduce_meta((2,), i, 3, "bxor", False) == ((2,), i)
    assert reduce_meta((2,), torch.bool, 3, "sum", False) == ((2,), torch.int64)
    for args in [((3,), f, 4, "sum", True), ((), f, 2, "sum", True), ((2,), f, 2, "band", False),
                 ((2,), i, 2, "avg", False), ((2,), torch.complex64, 2, "max", False),
                 ((2,), f, 2, "mean", False), ((2,), f, 0, "sum", False)]:
        with pytest.raises(ValueError):
            reduce_meta(*args)
    with pytest.raises(ValueError):
        reduce_meta((2, 2), f, 2, "sum", True, inplace=True)
    with pytest.raises(ValueError):
        reduce_meta((2,), f, 2, "stack", False, inplace=True)
    with pytest.raises(ValueError):
        reduce_meta((2, 2), f, 2, "sum", True, to_one=True)
    assert reduce_meta((2,), f, 2, "stack", False, to_one=True) == ((2, 2), f)
