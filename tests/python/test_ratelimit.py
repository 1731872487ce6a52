"""ratelimit.warn (issue 16, EP-5): warnings that can repeat go to stderr, never stdout, at
most one per kind per interval, then a count of those left out."""

from __future__ import annotations

from podium._src import ratelimit


def test_one_warning_per_kind_per_interval_then_a_count(capsys, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(ratelimit.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(ratelimit, "INTERVAL_S", 10.0)
    monkeypatch.setattr(ratelimit, "_kinds", {})
    for i in range(5):
        ratelimit.warn("a kind", f"first kind {i}")
    ratelimit.warn("another kind", "second kind")
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == ["podium: first kind 0", "podium: second kind"]
    now[0] += 10.0
    ratelimit.warn("a kind", "first kind again")
    ratelimit.warn("a kind", "left out")
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        "podium: first kind again",
        "podium: 4 more warnings of this kind (a kind) left out (at most one per 10 s)",
    ]
    ratelimit._flush_counts()  # at exit: what is still counted is said
    out, err = capsys.readouterr()
    assert (out, err) == (
        "", "podium: 1 more warning of this kind (a kind) left out (at most one per 10 s)\n")
    ratelimit._flush_counts()
    assert capsys.readouterr() == ("", "")
