# podium: `make demo` and `make test` set everything up themselves (see docs/build.md).
#
#   make setup   Debian packages (and chromium, for the dashboard test, when missing), pinned
#                Python packages, then one CMake build (via pip) of the C++ libraries,
#                binaries, GoogleTest suites and the podium._core extension; installs podium
#                into the active Python. Incremental when run again.
#   make test    setup, then every C++ test (ctest) and every Python test (pytest)
#   make demo    setup, then the main demo ($(DEMO))
#   make bench   setup, then `podium bench core --json`
#   make fuzz    build the fuzz targets with sanitizers ($(FUZZ_DIR)), run each FUZZ_SECONDS
#   make test-sanitize  the C++ tests built and run under ASan+UBSan ($(ASAN_DIR)) and TSan
#                ($(TSAN_DIR)); slow, not part of `make test`
#   make build-cuda  build against a CUDA-enabled UCX (the libucx-cu13 wheel), for CUDA
#                tensors in podium.rdma (docs/data.md, "GPU memory"); in $(CUDA_BUILD_DIR)
#   make stubs   build, then regenerate the typed stubs of podium._core (python/podium/_core/)
#   make clean   remove the build trees ($(BUILD_DIR), $(FUZZ_DIR), $(ASAN_DIR), $(TSAN_DIR))

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON    ?= python3
BUILD_DIR ?= build/py
# make build-cuda: UCX built with CUDA support, from PyPI, and its own build tree. UCX_ROOT (a
# UCX installation with include/ and lib/) builds against any other UCX.
UCX_CUDA_WHEEL := libucx-cu13==1.22.0
CUDA_BUILD_DIR ?= build/cuda
UCX_ROOT ?=
NPROC     := $(shell nproc 2>/dev/null || echo 2)
# Per-test limits: ctest's applies to tests without their own TIMEOUT property
# (podium_test() sets one), pytest's to every Python test.
CTEST_TIMEOUT  ?= 300
PYTEST_TIMEOUT ?= 120
# make fuzz (docs/fuzzing.md): its own sanitizer build; seconds per target; `make test`
# runs it too, for TEST_FUZZ_SECONDS per target.
FUZZ_DIR ?= build/fuzz
FUZZ_SECONDS ?= 60
TEST_FUZZ_SECONDS ?= 10
FUZZ_TARGETS := frame message auth actor_message cast_plan host_protocol
# make test-sanitize (docs/build.md): one build tree per sanitizer. SANITIZERS picks which.
ASAN_DIR ?= build/asan
TSAN_DIR ?= build/tsan
SANITIZERS ?= address thread
# Tests that cannot run under a sanitizer, as ctest -E regexes; each one's reason is in
# docs/build.md ("Sanitizer builds"). Keep these short.
SANITIZE_EXCLUDE_address ?= ChannelLimits\.TheAcceptLoopSurvivesRunningOutOfDescriptors
SANITIZE_EXCLUDE_thread ?=
export ASAN_OPTIONS ?= detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS ?= print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS ?= halt_on_error=1:second_deadlock_stack=1
# The main demo (the C++ one: $(BUILD_DIR)/examples/cpp/hello)
DEMO ?= $(PYTHON) examples/quickstart.py

export CMAKE_BUILD_PARALLEL_LEVEL ?= $(NPROC)
export DEBIAN_FRONTEND := noninteractive
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export PIP_ROOT_USER_ACTION := ignore

APT_PACKAGES := build-essential libasio-dev libmsgpack-cxx-dev libgtest-dev libbenchmark-dev \
                libspdlog-dev libfmt-dev libssl-dev openssl iproute2 slurm-wlm munge \
                pkg-config libucx-dev libucx0
# Build tools, runtime dependencies and test tools, pinned (torch: the CPU build, for tensors
# on the control and data planes and the tensor engine; pexpect: the terminal-driven CLI
# tests; ipykernel..nbformat: the executed notebook; matplotlib: the RL and FT examples' plots).
PIP_PACKAGES := cmake==4.4.4 ninja==1.13.2 scikit-build-core==1.1.2 nanobind==3.1.0 \
                msgpack==1.2.4 cloudpickle==3.1.2 numpy==2.4.6 pytest==9.0.3 \
                pytest-timeout==2.4.0 torch==2.13.0 pexpect==4.8.0 \
                ipykernel==7.4.0 jupyter_client==8.10.0 nbclient==0.11.0 nbformat==5.11.1 \
                matplotlib==3.10.7
# The browser of the dashboard's test (tests/python/test_dashboard.py), installed only when
# missing; a machine that cannot install it still sets up (that test then skips, saying why).
BROWSER_PACKAGE := chromium
# The ctest of the CMake that configured $(BUILD_DIR) (pip's cmake need not be on PATH).
CTEST = $(or $(shell sed -n 's/^CMAKE_CTEST_COMMAND:INTERNAL=//p' $(BUILD_DIR)/CMakeCache.txt \
                2>/dev/null),ctest)
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: help setup apt-packages browser pip-packages build build-cuda test demo bench fuzz fuzz-run stubs clean \
        test-sanitize

# $(call fuzz_run,SECONDS): configures $(FUZZ_DIR) (PODIUM_FUZZ=ON: ASan + UBSan, libFuzzer
# with clang), builds only the fuzz targets and what they compile, runs each for SECONDS and
# prints one summary line per target; exits non-zero on a crash. A shell script rather than a
# sub-make, so that `make -n test` prints it instead of running it.
define fuzz_run
cmake=$$($(PYTHON) -c 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))' \
          2>/dev/null || command -v cmake); \
gen=; if ninja=$$($(PYTHON) -c 'import ninja, os; print(os.path.join(ninja.BIN_DIR, "ninja"))' \
          2>/dev/null) && [ -x "$$ninja" ]; then gen="-G Ninja -DCMAKE_MAKE_PROGRAM=$$ninja"; \
elif command -v ninja >/dev/null; then gen="-G Ninja"; fi; \
mkdir -p $(FUZZ_DIR); \
if [ ! -f $(FUZZ_DIR)/CMakeCache.txt ]; then \
  "$$cmake" -S . -B $(FUZZ_DIR) $$gen -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPODIUM_FUZZ=ON \
    -DPODIUM_TESTS=OFF >$(FUZZ_DIR)/configure.log 2>&1 || \
    { cat $(FUZZ_DIR)/configure.log; echo "make fuzz: configure failed"; exit 1; }; \
fi; \
echo "fuzz: building $(FUZZ_TARGETS:%=fuzz_%) in $(FUZZ_DIR)"; \
"$$cmake" --build $(FUZZ_DIR) --target fuzz_all -j$(NPROC) >$(FUZZ_DIR)/build.log 2>&1 || \
  { tail -50 $(FUZZ_DIR)/build.log; echo "make fuzz: build failed"; exit 1; }; \
mkdir -p $(FUZZ_DIR)/runs; status=0; \
for t in $(FUZZ_TARGETS); do \
  log=$(FUZZ_DIR)/runs/$$t.log; \
  if (cd $(FUZZ_DIR)/runs && ../cpp/fuzz/fuzz_$$t -max_total_time=$(1)) >$$log 2>&1; then \
    line=$$(grep -E "^fuzz $$t: " $$log | tail -1); \
    if [ -z "$$line" ]; then \
      runs=$$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' $$log | tail -1); \
      line="fuzz $$t: $${runs:-?} iterations in $(1) s, 0 crashes (libFuzzer)"; \
    fi; \
    echo "$$line"; \
  else \
    status=1; grep -E "ERROR|SUMMARY|fuzz check|^fuzz $$t" $$log | head -8; \
    echo "fuzz $$t: CRASHED (see $$log, inputs in $(FUZZ_DIR)/runs)"; \
  fi; \
done; \
if [ $$status -eq 0 ]; then echo "make fuzz: 0 crashes"; else echo "make fuzz: FAILED"; fi; \
exit $$status
endef

# $(call sanitize_run): for each of $(SANITIZERS), configures its tree (PODIUM_SANITIZE_TESTS,
# no Python extension), builds it, runs its ctest without the excluded tests, then prints one
# summary line per sanitizer (pass/fail, seconds); exits non-zero if any failed. Suppression
# files, where present, are cpp/sanitize/<tool>.supp.
define sanitize_run
cmake=$$($(PYTHON) -c 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))' \
          2>/dev/null || command -v cmake); \
ctest=$$(dirname "$$cmake")/ctest; [ -x "$$ctest" ] || ctest=ctest; \
gen=; if ninja=$$($(PYTHON) -c 'import ninja, os; print(os.path.join(ninja.BIN_DIR, "ninja"))' \
          2>/dev/null) && [ -x "$$ninja" ]; then gen="-G Ninja -DCMAKE_MAKE_PROGRAM=$$ninja"; \
elif command -v ninja >/dev/null; then gen="-G Ninja"; fi; \
supp=$$(pwd)/cpp/sanitize; \
[ -f $$supp/lsan.supp ] && export LSAN_OPTIONS="suppressions=$$supp/lsan.supp:$${LSAN_OPTIONS:-}"; \
[ -f $$supp/tsan.supp ] && export TSAN_OPTIONS="suppressions=$$supp/tsan.supp:$$TSAN_OPTIONS"; \
status=0; summary=; \
for san in $(SANITIZERS); do \
  case $$san in address) dir=$(ASAN_DIR); ex='$(SANITIZE_EXCLUDE_address)';; \
                thread) dir=$(TSAN_DIR); ex='$(SANITIZE_EXCLUDE_thread)';; \
                *) echo "test-sanitize: unknown sanitizer $$san"; exit 2;; esac; \
  start=$$(date +%s); result=passed; \
  echo "== $$san: configure and build $$dir =="; \
  mkdir -p $$dir; \
  if ! "$$cmake" -S . -B $$dir $$gen -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPODIUM_TESTS=ON \
         -DPODIUM_PYTHON=OFF -DPODIUM_SANITIZE_TESTS=$$san >$$dir/configure.log 2>&1; then \
    cat $$dir/configure.log; result="FAILED (configure)"; \
  elif ! "$$cmake" --build $$dir -j$(NPROC) >$$dir/build.log 2>&1; then \
    tail -50 $$dir/build.log; result="FAILED (build)"; \
  else \
    echo "== $$san: ctest $${ex:+(excluded: $$ex)} =="; \
    if ! "$$ctest" --test-dir $$dir --output-on-failure -j$(NPROC) --timeout $(CTEST_TIMEOUT) \
           $${ex:+-E "$$ex"}; then result=FAILED; fi; \
  fi; \
  [ "$$result" = passed ] || status=1; \
  summary="$$summary$$(printf '\ntest-sanitize %-8s %s in %d s' $$san "$$result" \
                        $$(( $$(date +%s) - start )))"; \
done; \
echo "== Summary =="; echo "$${summary#?}"; \
if [ $$status -eq 0 ]; then echo "make test-sanitize: all passed"; \
else echo "make test-sanitize: FAILED"; fi; \
exit $$status
endef

help:
	@sed -n '3,13s/^# \{0,1\}//p' $(firstword $(MAKEFILE_LIST))

setup: apt-packages browser pip-packages build

apt-packages:
	@if dpkg -s $(APT_PACKAGES) >/dev/null 2>&1; then \
	  echo "setup: Debian packages already installed"; \
	else \
	  echo "setup: installing Debian packages: $(APT_PACKAGES)"; \
	  $(SUDO) apt-get update; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y --no-install-recommends $(APT_PACKAGES); \
	fi

browser:
	@if command -v chromium >/dev/null 2>&1; then \
	  echo "setup: chromium already installed"; \
	else \
	  echo "setup: installing $(BROWSER_PACKAGE) (the dashboard test's browser)"; \
	  { $(SUDO) apt-get update && $(SUDO) env DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y --no-install-recommends $(BROWSER_PACKAGE); } || \
	    echo "setup: $(BROWSER_PACKAGE) could not be installed: tests/python/test_dashboard.py will skip"; \
	fi

pip-packages: apt-packages
	$(PYTHON) -m pip install -q $(PIP_PACKAGES)

# The one build: scikit-build-core configures and builds every default CMake target in
# $(BUILD_DIR) (libraries, binaries, GoogleTest suites, podium._core), then installs the wheel.
build: pip-packages
	$(PYTHON) -m pip install --no-build-isolation -v \
	  -Cbuild-dir=$(BUILD_DIR) -Ccmake.define.PODIUM_TESTS=ON \
	  -Ccmake.define.PODIUM_UCX_ROOT=$(UCX_ROOT) .
	@# pyenv finds new console scripts (the `podium` command) only after a rehash.
	@if command -v pyenv >/dev/null 2>&1; then pyenv rehash || true; fi

build-cuda: pip-packages
	$(PYTHON) -m pip install -q $(UCX_CUDA_WHEEL)
	$(MAKE) build BUILD_DIR=$(CUDA_BUILD_DIR) \
	  UCX_ROOT="$$($(PYTHON) -c 'import libucx, os; print(os.path.dirname(libucx.__file__))')"

test: setup
	@status=0; \
	echo "== C++ tests (ctest) =="; \
	if ! listing=$$($(CTEST) --test-dir $(BUILD_DIR) -N); then \
	  echo "ctest: cannot list the tests of $(BUILD_DIR)"; status=1; \
	elif echo "$$listing" | grep -qx 'Total Tests: 0'; then \
	  echo "ctest: 0 tests registered in $(BUILD_DIR): 0 passed, 0 failed"; \
	else \
	  $(CTEST) --test-dir $(BUILD_DIR) --output-on-failure -j$(NPROC) \
	    --timeout $(CTEST_TIMEOUT) || status=1; \
	fi; \
	echo "== Python tests (pytest) =="; \
	rc=0; $(PYTHON) -m pytest -q --timeout=$(PYTEST_TIMEOUT) tests/python || rc=$$?; \
	if [ $$rc -eq 5 ]; then \
	  echo "pytest: no tests collected (exit 5), counted as a pass"; \
	elif [ $$rc -ne 0 ]; then \
	  status=1; \
	fi; \
	echo "== Fuzz targets ($(TEST_FUZZ_SECONDS) s each) =="; \
	( $(call fuzz_run,$(TEST_FUZZ_SECONDS)) ) || status=1; \
	if [ $$status -eq 0 ]; then echo "make test: all passed"; else echo "make test: FAILED"; fi; \
	exit $$status

demo: setup
	@command -v $(firstword $(DEMO)) >/dev/null || { \
	  echo "make demo: cannot run $(DEMO): $(firstword $(DEMO)) not found (not built yet?)" >&2; \
	  exit 1; }
	$(DEMO)

bench: setup
	$(PYTHON) -m podium bench core --json

fuzz: pip-packages
	@$(call fuzz_run,$(FUZZ_SECONDS))

fuzz-run:
	@$(call fuzz_run,$(FUZZ_SECONDS))

test-sanitize: apt-packages
	@$(call sanitize_run)

# The .pyi stubs of podium._core, generated by nanobind's stub generator from the installed
# build (docs/python.md, "Typed stubs"); tests/python/test_stubs.py fails when they are stale.
# The next `make build` puts them into the wheel.
stubs: build
	rm -rf python/podium/_core
	$(PYTHON) -m nanobind.stubgen -q -r -m podium._core -O python/podium

clean:
	rm -rf $(BUILD_DIR) $(FUZZ_DIR) $(ASAN_DIR) $(TSAN_DIR)
