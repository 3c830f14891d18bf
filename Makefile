# Thin wrapper over CMake for the README's two commands (make demo, make test) and friends.
# Every target runs the idempotent setup first, so a fresh machine needs nothing else.
JOBS ?= 2
BUILD ?= build

.PHONY: setup build test demo asan fuzz clean

setup:
	@scripts/setup.sh

build: setup
	@cmake --preset release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

demo: build
	@scripts/demo.sh

asan: setup
	@cmake --preset asan >/dev/null
	@cmake --build build-asan -j $(JOBS)
	@cd build-asan && ctest --output-on-failure -j $(JOBS)

fuzz: setup
	@cmake --preset fuzz >/dev/null
	@cmake --build build-fuzz -j $(JOBS)

clean:
	rm -rf build build-debug build-asan build-fuzz
