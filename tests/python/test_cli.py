"""The `podium` command line, the installed package layout and podium._core.build_info()."""

from __future__ import annotations

import os
import stat
from importlib.metadata import entry_points
from pathlib import Path

import podium
from podium import _core
from podium._src import bin_dir
from podium._src.cli import available_benchmarks


def _fake_bench(folder: Path, name: str, body: str) -> None:
    """An executable podium-bench-NAME shell script in folder (a PODIUM_BIN_DIR)."""
    path = folder / f"podium-bench-{name}"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def test_build_info_has_expected_keys():
    info = _core.build_info()
    assert {"version", "compiler", "build_type", "bindings", "runtime_binaries"} <= set(info)
    assert info["version"] == podium.__version__
    assert info["compiler"].split()[0] in {"GNU", "Clang"}  # "<id> <version>"
    assert info["build_type"]
    assert info["cxx_standard"] >= 202100


def test_version_command(run_podium):
    r = run_podium("version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"podium {podium.__version__}\n")
    assert _core.build_info()["compiler"] in r.stdout


def test_version_verbose_lists_every_build_info_key(run_podium):
    r = run_podium("version", "--verbose")
    assert r.returncode == 0, r.stderr
    for key in _core.build_info():
        assert f"  {key}: " in r.stdout


def test_console_script_points_at_cli_main():
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "podium"]
    assert script.value == "podium._src.cli:main"


def test_bin_dir_is_inside_the_installed_package():
    assert bin_dir() == Path(podium.__file__).resolve().parent / "_bin"


def test_every_runtime_binary_is_installed_and_executable():
    for name in _core.build_info()["runtime_binaries"]:
        path = bin_dir() / name
        assert path.is_file(), f"{name}: registered by podium_runtime_binary, not in {bin_dir()}"
        assert os.access(path, os.X_OK)


def test_bench_without_name_lists_available(run_podium, tmp_path):
    _fake_bench(tmp_path, "alpha", "exit 0")
    r = run_podium("bench", env={"PODIUM_BIN_DIR": str(tmp_path)})
    assert r.returncode == 2
    assert "available benchmarks: alpha" in r.stderr


def test_bench_unknown_name_lists_available(run_podium):
    r = run_podium("bench", "nosuch")
    assert r.returncode == 2
    assert "unknown benchmark 'nosuch'" in r.stderr
    assert "available benchmarks:" in r.stderr
    for name in available_benchmarks():
        assert name in r.stderr


def test_bench_unknown_name_lists_each_installed_benchmark(run_podium, tmp_path):
    _fake_bench(tmp_path, "alpha", "exit 0")
    _fake_bench(tmp_path, "beta", "exit 0")
    (tmp_path / "podium-bench-notexec").write_text("")
    r = run_podium("bench", "nosuch", env={"PODIUM_BIN_DIR": str(tmp_path)})
    assert r.returncode == 2
    assert "available benchmarks: alpha, beta" in r.stderr


def test_bench_passes_arguments_output_and_exit_code_through(run_podium, tmp_path):
    _fake_bench(tmp_path, "echo", 'echo "args:$*"; echo "to stderr" >&2; exit 7')
    r = run_podium("bench", "echo", "--json", "-x", "3", env={"PODIUM_BIN_DIR": str(tmp_path)})
    assert r.returncode == 7
    assert r.stdout == "args:--json -x 3\n"
    assert r.stderr == "to stderr\n"


def test_missing_subcommand_is_a_usage_error(run_podium):
    r = run_podium()
    assert r.returncode == 2
    assert "usage: podium" in r.stderr
