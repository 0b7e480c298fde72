# Hillside: `make run` opens the desktop app (or, without a display, serves the web UI and the API
# on 127.0.0.1:8080), `make test` runs every test. Both install what they need first
# (scripts/setup.sh).

SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
# Builds live outside the clone so a fresh checkout (CI) reuses them.
export CARGO_TARGET_DIR ?= $(HOME)/.cache/hillside-target

.PHONY: setup setup-tests ui ui-test browser-test desktop-test run test bench clean

# The programs `make test`'s one workspace build made, which its later steps run as they are.
BUILT := $(CARGO_TARGET_DIR)/debug

setup:
	@scripts/setup.sh

setup-tests:
	@scripts/setup.sh --tests

# The web UI (ui/dist), which hillside-server embeds: npm installs its locked packages when the
# lock file changed, then Vite builds it.
ui:
	cd ui && { [ node_modules/.package-lock.json -nt package-lock.json ] || npm ci --no-audit --no-fund; } && npm run build

# The UI in Chromium (headless) against a real `hillside serve`.
ui-test: ui
	cargo build -p hillside -p hillside-documents --bin hillside --bin hillside-ingest
	$(MAKE) browser-test

# The same on the programs built already.
browser-test:
	cd ui && HILLSIDE_BIN=$(BUILT)/hillside npx playwright test

# The desktop app on a virtual display (Xvfb): its window, its endpoint, a clean exit; and a
# dropped file reaching the documents API.
desktop-test: ui
	# The document reader beside the app (`make test` built it already; built alone, its
	# dependencies would build again with fewer features).
	[ -x $(CARGO_TARGET_DIR)/debug/hillside-ingest ] || cargo build -p hillside -p hillside-documents --bin hillside-ingest
	cargo test -p hillside-desktop

run: setup ui
	# hillside-xrt-probe looks for a SmartSSD, and hillside-ingest reads each document, in a
	# process of its own, beside the program (built with it, so that they share its build).
	cargo build --release -p hillside-engine --bin hillside-xrt-probe
	if [ -n "$${DISPLAY:-}$${WAYLAND_DISPLAY:-}" ]; then \
	  cargo build --release -p hillside-desktop -p hillside-documents --bin hillside-desktop --bin hillside-ingest && \
	  cargo run --release -p hillside-desktop; \
	else \
	  echo "no display: serving the web UI instead of opening the window"; \
	  cargo build --release -p hillside -p hillside-documents --bin hillside --bin hillside-ingest && \
	  cargo run --release -p hillside -- serve; \
	fi

test: setup-tests ui
	# One format (rustfmt.toml), and no lint warnings from the clippy of the Rust that rust-version
	# names (pinned, so that a new stable's lints cannot fail a build; this also checks that the
	# workspace builds with that Rust), before anything runs. It has a target dir of its own.
	cargo fmt --all --check
	CARGO_TARGET_DIR=$(CARGO_TARGET_DIR)/msrv cargo +$$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml) clippy --workspace --all-targets -- -D warnings
	# Every crate, the desktop app's too (its window test starts Xvfb), is built once, with one
	# feature set: the steps below run what this build made instead of building the dependency
	# tree again for a narrower set. The remote-engine tests run against llama.cpp's
	# llama-server, and the model families' against libllama (llama-logits), built once from the
	# PyPI sdist outside the clone. No doc tests are written, so rustdoc's pass over each crate
	# (45 s in all) is left out.
	HILLSIDE_LLAMA_SERVER=$$(scripts/llama-cpp-build.sh native llama-server) \
	  HILLSIDE_LLAMA_LOGITS=$$(scripts/llama-cpp-build.sh native llama-logits) \
	  cargo test --workspace --lib --bins --tests
	# The kernels' unit tests check every SIMD level the CPU has; the small ops follow the level
	# in force, so the unit tests run again portable, and so do SmolLM2's logits against candle's
	# (the run above took the fastest level, and Qwen2's K-quant formats too, whose kernels the
	# unit tests cover at every level); at AVX2 too where that was not AVX2.
	# `--bins` keeps the packages that only have programs in the selection: without them cargo
	# resolves a narrower feature set and builds the engine and everything above it again.
	HILLSIDE_SIMD=portable cargo test --workspace --lib --bins
	HILLSIDE_SIMD=portable cargo test --workspace --bins --test reference_logits -- --exact logits_match_candle_quantized_llama
	if grep -qw avx512f /proc/cpuinfo; then HILLSIDE_SIMD=avx2 cargo test --workspace --bins --test reference_logits -- --exact logits_match_candle_quantized_llama; fi
	# The official openai Python client against `hillside serve`.
	HILLSIDE_BIN=$(BUILT)/hillside scripts/openai-client-test.sh
	# The published OpenAPI document against the server (schemathesis, 20 cases a route).
	HILLSIDE_BIN=$(BUILT)/hillside scripts/api-conformance.sh 20
	# The FPGA scoring kernel's C simulation against the Rust reference's vectors.
	$(MAKE) -C fpga csim BUILD=$(CARGO_TARGET_DIR)/fpga
	# The web UI in Chromium against `hillside serve` on the real model.
	$(MAKE) browser-test

bench: setup
	cargo run --release -p hillside-bench -- decode --json docs/bench-decode.json

clean:
	cargo clean
