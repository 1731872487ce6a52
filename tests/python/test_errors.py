"""The one error table (podium._src.errors.TABLE): every code of every C++ error enum maps to
a Python exception chosen on purpose, and both paths (a binding that fails at once, a reply
that carries an error) raise the same one."""

import pytest

from podium._core import base as _base
from podium._core import ndslice as _nd
from podium._src import errors
from podium.actor import ActorError, SupervisionError


def test_the_enums_are_read_from_the_cpp_enums():
    # Values the C++ headers give (base/error.h, actor/ids.h, channel/net.h, host/error.h):
    # the scan of the compiled enums found them under their C++ names.
    assert _base.Subsystem.ACTOR == 4 and _base.Subsystem.SUPERVISION == 7
    assert _base.BaseErrc.CANCELLED.value == 4
    assert _base.ActorErrc.TIMEOUT.value == 111 and _base.ActorErrc.PROC_EXITED.value == 113
    assert _base.ChannelErrc.TLS_FAILED.value == 109
    assert _base.HostErrc.STOPPED.value == 106
    # Codes of different subsystems share numbers; their members stay apart.
    assert _base.ActorErrc.NO_SUCH_PORT != _base.NdsliceErrc.OUT_OF_RANGE
    assert _base.ERRC[_base.Subsystem.ACTOR] is _base.ActorErrc
    for sub, enum in _base.ERRC.items():
        assert len(enum) > 0, sub


def test_every_cpp_error_code_has_a_row():
    missing = [f"{enum.__name__}.{m.name}" for enum in _base.ERRC.values() for m in enum
               if m not in errors.TABLE]
    assert not missing, f"add a row to podium._src.errors.TABLE for: {missing}"
    for key, cls in errors.TABLE.items():
        assert type(key) in _base.ERRC.values(), key
        assert isinstance(cls, type) and issubclass(cls, BaseException), key
        # ActorError means "an endpoint raised": no C++ code means that by itself.
        assert not issubclass(cls, ActorError), key


def test_only_subsystems_without_codes_of_their_own_lack_an_enum():
    assert set(_base.Subsystem) - set(_base.ERRC) <= {_base.Subsystem.MESH,
                                                       _base.Subsystem.SUPERVISION}


def test_a_shut_down_mesh_is_a_supervision_error_not_an_actor_error():
    sub, code = int(_base.Subsystem.BASE), _base.BaseErrc.CANCELLED.value
    for translate in (errors.from_core, errors.from_reply):
        e = translate(sub, code, "the host mesh was shut down", "ping")
        assert isinstance(e, SupervisionError) and not isinstance(e, ActorError)
        assert "the host mesh was shut down" in str(e) and e.endpoint == "ping"


@pytest.mark.parametrize("key", sorted(errors.TABLE, key=lambda k: (type(k).__name__, k.value)),
                         ids=lambda k: f"{type(k).__name__}.{k.name}")
def test_both_paths_raise_the_class_of_the_row(key):
    sub = int(errors._SUBSYSTEM_OF[type(key)])
    cls = errors.TABLE[key]
    e = errors.from_core(sub, key.value, "why")
    assert type(e) is cls and "why" in str(e)
    r = errors.from_reply(sub, key.value, "why")
    if cls is _base.CoreError:
        assert isinstance(r, ActorError) and isinstance(r.exception, _base.CoreError)
        assert (r.exception.subsystem, r.exception.code) == (sub, key.value)
    else:
        assert type(r) is cls


def test_a_code_this_build_does_not_know_is_a_core_error():
    e = errors.from_core(int(_base.Subsystem.ACTOR), 199, "from a newer peer")
    assert isinstance(e, _base.CoreError) and e.code == 199
    assert errors.errc(int(_base.Subsystem.ACTOR), 199) is None
    assert errors.errc(int(_base.Subsystem.ACTOR), 111) is _base.ActorErrc.TIMEOUT


def test_a_binding_raises_the_tables_exception():
    # NdsliceErrc.BAD_SHAPE (a size of 0) and OUT_OF_RANGE, raised by the binding at once.
    with pytest.raises(errors.TABLE[_base.NdsliceErrc.BAD_SHAPE]):
        _nd.Extent(["a"], [0])
    with pytest.raises(errors.TABLE[_base.NdsliceErrc.OUT_OF_RANGE]):
        _nd.Extent(["a"], [2]).point_of_rank(5)
