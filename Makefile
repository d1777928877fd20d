# longhaul front door. `make` installs dependencies and builds build/longhaul;
# `make test` runs the whole suite; `make demo` runs the main job end to end.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
# make's "Entering directory" lines of the nested builds are noise
MAKEFLAGS += --no-print-directory

.PHONY: all deps build test demo asan tsan noomp fuzz trust-calibrate trust-noise bench-train bench-generate bench-serve-load results results-network results-lag fixtures clean \
	format

all: build

deps:
	@bash scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The demo builds quietly (the compiler's lines go to $(BUILD)/build.log, shown only on failure).
demo: deps
	@echo "demo: building longhaul (log in $(BUILD)/build.log)"
	@mkdir -p $(BUILD)
	@{ cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) && \
	  cmake --build $(BUILD) -j $(JOBS); } >$(BUILD)/build.log 2>&1 || \
	  { cat $(BUILD)/build.log; echo "demo: the build failed"; exit 1; }
	@bash scripts/demo.sh $(BUILD)/longhaul

# The suite under AddressSanitizer + UndefinedBehaviorSanitizer (with float-cast-overflow, which
# -fsanitize=undefined leaves out), and under ThreadSanitizer.
# TSan builds without OpenMP: libgomp is not instrumented, so its barriers are invisible to
# TSan and every parallel loop would be reported; the target checks longhaul's own threads.
asan: deps
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLH_SANITIZE=address,undefined,float-cast-overflow >/dev/null
	@cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS)

tsan: deps
	@cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLH_SANITIZE=thread -DLH_OPENMP=OFF >/dev/null
	@cmake --build build-tsan -j $(JOBS)
	@# the 6 GiB RSS check is meaningless under TSan's shadow memory (9 GiB measured): left out here.
	@# OpenBLAS runs single-threaded (also set per test in tests/CMakeLists.txt): Debian's
	@# libopenblas.so.0 is the OpenMP build, whose libgomp threads TSan cannot see.
	cd build-tsan && OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 ctest --output-on-failure -j $(JOBS) -E integration_qwen05_rss

# Calibration of rollout verification (docs/SECURITY.md): honest runs on the Release and the
# non-OpenMP builds, 1 and 2 threads, worker and server on different kernel paths, then one run
# per adversary mode. Resumable: finished runs are skipped (results in build/trust-calib/*.json);
# ROUNDS=N for more honest runs, REDO=stale to run again what a rebuilt binary changes, ONLY=REGEX
# for some runs. trust-noise: the same noise on the Qwen2.5-0.5B shape (bench/verify_noise.sh,
# about 25 minutes). Neither is part of `make test`.
trust-calibrate: build
	@cmake -S . -B build-noomp -DCMAKE_BUILD_TYPE=Release -DLH_OPENMP=OFF >/dev/null
	@cmake --build build-noomp -j $(JOBS) --target longhaul
	BINS="$(BUILD)/longhaul build-noomp/longhaul" bash bench/trust_calibrate.sh $(BUILD)/trust-calib

trust-noise: build
	@cmake -S . -B build-noomp -DCMAKE_BUILD_TYPE=Release -DLH_OPENMP=OFF >/dev/null
	@cmake --build build-noomp -j $(JOBS) --target verify_noise
	@cmake --build $(BUILD) -j $(JOBS) --target verify_noise
	bash bench/verify_noise.sh $(BUILD)/verify-noise

# The suite with OpenMP off (the build must pass without it).
noomp: deps
	@cmake -S . -B build-noomp -DCMAKE_BUILD_TYPE=Release -DLH_OPENMP=OFF >/dev/null
	@cmake --build build-noomp -j $(JOBS)
	cd build-noomp && ctest --output-on-failure -j $(JOBS)

# libFuzzer targets (clang); FUZZ_SECONDS per target. Only the targets (and the core library)
# are built; UBSan findings abort so the fuzzer reports them; crash inputs land in build-fuzz/.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := $(notdir $(basename $(wildcard tests/fuzz/fuzz_*.c)))
fuzz: deps
	@CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLH_FUZZ=ON -DLH_OPENMP=OFF \
	  -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link,address,undefined,float-cast-overflow -fno-sanitize-recover=all" >/dev/null
	@cmake --build build-fuzz -j $(JOBS) --target $(FUZZ_TARGETS)
	@for n in $(FUZZ_TARGETS); do \
	  c=tests/fuzz/corpus/$${n#fuzz_}; mkdir -p build-fuzz/corpus-$$n; \
	  echo "fuzzing $$n for $(FUZZ_SECONDS)s"; \
	  build-fuzz/tests/$$n -max_total_time=$(FUZZ_SECONDS) -artifact_prefix=build-fuzz/$$n- \
	    -close_fd_mask=2 build-fuzz/corpus-$$n $$c || exit 1; done

# Training-step benchmark against the PyTorch peer (see docs/PERFORMANCE.md).
bench-train: build
	@bash bench/train.sh $(BUILD)

# Generation (rollout decode) benchmark against the PyTorch peer (see docs/PERFORMANCE.md).
bench-generate: build
	@bash bench/generate.sh $(BUILD)

# The load test of serve (issue 19): 64 signed clients against `serve --no-verify` on loopback,
# 20 s each: closed loop (the saturation throughput), then open loop at 2,000 groups/s offered
# (the latency, from each submission's due time); accepted groups/s, p50/p99, serve's RSS
# (see docs/PERFORMANCE.md).
bench-serve-load: build
	@bash bench/serve_load.sh $(BUILD)
	@RATE=2000 bash bench/serve_load.sh $(BUILD)

# The experiments of docs/RESULTS.md (RL against SFT controls, the staleness table): about 1.5
# hours on 2 cores; outputs and summary.md in results/.
results: build
	@bash scripts/results.sh $(BUILD)/longhaul all

# Only the networked runs of docs/RESULTS.md (serve + workers against rl, sort, 2 seeds): about
# 15 minutes; resumable like the rest (finished runs are skipped).
results-network: build
	@bash scripts/results.sh $(BUILD)/longhaul network

# Issue 16's lag table (docs/RESULTS.md, "Learning from stale rollouts"); resumable, hours in
# full: LAG_ENVS, LAG_LOSSES, LAG_KS, LAG_MODES and LAG_SEEDS choose a part of it.
results-lag: build
	@bash scripts/results.sh $(BUILD)/longhaul lag

# Regenerates the reference fixtures in tests/fixtures: PyTorch parity (training), greedy
# generation, the policy loss and one RL update (needs python3-torch), tokenizer ids from the
# npm reference (needs npm).
fixtures: build
	@bash tests/ref/make_fixtures.sh $(BUILD)/longhaul
	@bash tests/ref/make_greedy_fixtures.sh $(BUILD)/longhaul
	@bash tests/ref/make_rl_fixtures.sh $(BUILD)/longhaul
	@bash tests/ref/make_tokenizer_fixtures.sh $(BUILD)/longhaul

format:
	@clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build build-asan build-tsan build-noomp build-fuzz
