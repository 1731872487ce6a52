"""The typed stubs of podium._core (python/podium/_core/*.pyi) are what nanobind's stub
generator writes for this build, and the installed package carries them.

The stubs are checked in so that type checkers and IDEs see podium._core's API; `make stubs`
regenerates them (docs/python.md, "Typed stubs"). A binding change without `make stubs` fails
here with the diff.
"""

import difflib
import subprocess
import sys
from pathlib import Path

import podium

REPO = Path(__file__).resolve().parents[2]
CHECKED_IN = REPO / "python" / "podium" / "_core"


def _generate(out: Path) -> Path:
    proc = subprocess.run(
        [sys.executable, "-m", "nanobind.stubgen", "-q", "-r", "-m", "podium._core", "-O",
         str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, f"nanobind.stubgen failed:\n{proc.stdout}\n{proc.stderr}"
    return out / "_core"


def _stubs(folder: Path) -> dict:
    return {p.name: p.read_text() for p in sorted(folder.glob("*.pyi"))}


def test_checked_in_stubs_match_the_build(tmp_path):
    fresh = _stubs(_generate(tmp_path))
    kept = _stubs(CHECKED_IN)
    assert "mesh.pyi" in fresh and "__init__.pyi" in fresh
    problems = []
    for name in sorted(set(fresh) | set(kept)):
        if name not in kept:
            problems.append(f"{name}: generated but not checked in")
        elif name not in fresh:
            problems.append(f"{name}: checked in but no longer generated")
        elif fresh[name] != kept[name]:
            diff = difflib.unified_diff(kept[name].splitlines(keepends=True),
                                        fresh[name].splitlines(keepends=True),
                                        f"checked-in/{name}", f"generated/{name}")
            problems.append("".join(diff))
    assert not problems, ("the stubs of podium._core are stale; run `make stubs`:\n"
                          + "\n".join(problems))


def test_stubs_are_deterministic(tmp_path):
    """Two runs write the same bytes: no memory addresses, no order that changes."""
    first = _stubs(_generate(tmp_path / "a"))
    second = _stubs(_generate(tmp_path / "b"))
    assert first == second
    for name, text in first.items():
        assert " at 0x" not in text, f"{name} holds a memory address"


def test_the_installed_package_carries_the_stubs():
    installed = Path(podium.__file__).parent
    assert (installed / "py.typed").is_file()
    assert (installed / "_core" / "mesh.pyi").is_file()
    # The extension module, not the stub folder, is what `import podium._core` finds.
    import podium._core as core

    assert Path(core.__file__).suffix in (".so", ".pyd")
