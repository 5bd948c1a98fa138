# Thin wrapper over CMake. `make demo` and `make test` install missing Debian packages first.
BUILD      ?= build
SAN_BUILD  ?= build-sanitize
TSAN_BUILD ?= build-tsan
JOBS       ?= 2
PYTHON     ?= /usr/bin/python3
FUZZ_SECONDS ?= 10
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test test-fast test-sanitize test-tsan fuzz-smoke bench clean

all: build

deps:
	@scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DPACKPIPE_PYTHON_EXECUTABLE=$(PYTHON) $(CMAKE_FLAGS) > $(BUILD).configure.log 2>&1 \
	  || (cat $(BUILD).configure.log; exit 1)

build: configure
	cmake --build $(BUILD) -j$(JOBS)

demo: build
	@scripts/demo.sh $(BUILD)

# Every C++ and Python test, then the same C++ tests under ASan+UBSan, the fuzz smoke runs, and the
# runtime's tests (threads exchanging buffers) under ThreadSanitizer.
test: test-fast test-sanitize fuzz-smoke test-tsan

test-fast: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

$(SAN_BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(SAN_BUILD) -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -gline-tables-only" \
	  "-DCMAKE_C_FLAGS_DEBUG=-O1 -gline-tables-only" -DCMAKE_C_COMPILER=clang \
	  -DCMAKE_CXX_COMPILER=clang++ -DPACKPIPE_SANITIZE=address,undefined -DPACKPIPE_BUILD_FUZZERS=ON \
	  -DPACKPIPE_BUILD_PYTHON=OFF -DPACKPIPE_BUILD_BENCHMARKS=OFF -DPACKPIPE_WITH_CUDA=OFF \
	  -DPACKPIPE_WITH_NCCL=OFF > $(SAN_BUILD).configure.log 2>&1 || (cat $(SAN_BUILD).configure.log; exit 1)

test-sanitize: deps $(SAN_BUILD)/CMakeCache.txt
	cmake --build $(SAN_BUILD) -j$(JOBS)
	cd $(SAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j$(JOBS) -LE 'gpu|python|bench'

# ThreadSanitizer on the in-process transport: the runtime's tests only (the component libraries they
# link are built too). TSAN_OPTIONS makes a race fail the test.
$(TSAN_BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -gline-tables-only" \
	  "-DCMAKE_C_FLAGS_DEBUG=-O1 -gline-tables-only" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
	  -DPACKPIPE_SANITIZE=thread -DPACKPIPE_BUILD_PYTHON=OFF -DPACKPIPE_BUILD_BENCHMARKS=OFF \
	  -DPACKPIPE_WITH_CUDA=OFF -DPACKPIPE_WITH_NCCL=OFF > $(TSAN_BUILD).configure.log 2>&1 \
	  || (cat $(TSAN_BUILD).configure.log; exit 1)

test-tsan: deps $(TSAN_BUILD)/CMakeCache.txt
	cmake --build $(TSAN_BUILD) -j$(JOBS) --target packpipe_tests_runtime
	cd $(TSAN_BUILD) && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 PACKPIPE_TEST_SCALE=tsan \
	  ctest --output-on-failure -j$(JOBS) -L runtime

fuzz-smoke: test-sanitize
	scripts/fuzz-smoke.sh $(SAN_BUILD) $(FUZZ_SECONDS)

bench: build
	$(BUILD)/packpipe_bench

clean:
	rm -rf $(BUILD) $(SAN_BUILD) $(TSAN_BUILD) $(BUILD).configure.log $(SAN_BUILD).configure.log $(TSAN_BUILD).configure.log
