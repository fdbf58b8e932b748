# amp-convert: every dependency is declared here or in pyproject.toml.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
ZOOVENV ?= .venv-zoo
ORTZOOVENV ?= .venv-ortzoo

.PHONY: setup demo test lint pypi-models browser zoo zoo-full zoo-ort zoo-ort-full bench bench-casts bench-ort bench-convert bench-auto bench-latency fuzz fingerprint bench-startup bench-memory clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

# Convert the sample model (a reduced ResNet-50 from the zoo).
demo: setup
	mkdir -p out
	$(BIN)/amp-convert models/zoo/resnet50.onnx --level O2 -o out/resnet50.fp16.onnx

# Real models shipped inside PyPI wheels (rapidocr, silero-vad), cached in models/cache/pypi.
pypi-models: setup
	$(BIN)/python models/fetch_pypi_models.py

# Debian's chromium, for the test that opens the HTML report in a real headless browser.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  SUDO=$$(command -v sudo >/dev/null 2>&1 && [ "$$(id -u)" != 0 ] && echo sudo); \
	  $$SUDO apt-get install -y -q chromium >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q chromium >/dev/null; }; }

test: setup pypi-models browser
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check amp_convert tests models scripts
	$(BIN)/ruff format --check amp_convert tests models scripts

# Rebuild the committed reduced zoo (needs torch + torchvision, about 5.5 GB).
$(ZOOVENV)/.installed:
	$(PYTHON) -m venv $(ZOOVENV)
	$(ZOOVENV)/bin/python -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(ZOOVENV)/bin/python -m pip install -q transformers onnx==1.23.2 onnxscript onnxruntime numpy
	touch $@

zoo: $(ZOOVENV)/.installed
	$(ZOOVENV)/bin/python models/build_zoo.py

zoo-full: $(ZOOVENV)/.installed
	$(ZOOVENV)/bin/python models/build_zoo.py --full

# Rebuild the committed onnxruntime-optimized transformer graphs (models/zoo/ort; CPU torch, about 1 GB).
$(ORTZOOVENV)/.installed:
	$(PYTHON) -m venv $(ORTZOOVENV)
	$(ORTZOOVENV)/bin/python -m pip install -q torch==2.13.0
	$(ORTZOOVENV)/bin/python -m pip install -q transformers onnx==1.23.2 onnxruntime==1.31.1 numpy sympy
	touch $@

zoo-ort: $(ORTZOOVENV)/.installed
	$(ORTZOOVENV)/bin/python models/build_ort_zoo.py

# The issue's sizes (4 layers, hidden 256) into models/cache/ort, for the benchmarks.
zoo-ort-full: $(ORTZOOVENV)/.installed
	$(ORTZOOVENV)/bin/python models/build_ort_zoo.py --full

# Property-based fuzzing: thousands of random graphs at every level and dtype.
fuzz: setup
	AMP_FUZZ_EXAMPLES=$${AMP_FUZZ_EXAMPLES:-5000} $(BIN)/python -m pytest -q tests/test_fuzz.py -k "random_graphs or random_options"

# One hash per model, level and dtype over what amp-convert writes: a refactoring leaves it unchanged.
fingerprint: setup
	$(BIN)/python scripts/fingerprint.py

# Every benchmark; each prints its tables (figures in BENCHMARKS.md).
bench: bench-casts bench-ort bench-convert bench-auto bench-latency bench-startup

bench-casts: setup pypi-models
	$(BIN)/python scripts/bench_casts.py

# Synthetic 2k-100k-node graphs, the 3 GB external-data model and the zoo (models built and cached on first run).
# The peers given amp-convert's O2 black list are quadratic: expect several 300 s timeouts (about an hour in all).
bench-convert: setup pypi-models
	$(BIN)/python scripts/bench_convert.py --kinds transformer,conv --big --zoo --timeout 300 --repeat 3

# onnxruntime-optimized transformer graphs and CNN fusions against onnxruntime's converter and onnxconverter-common
# (full-size graphs too where `make zoo-ort-full` built them).
bench-ort: setup
	$(BIN)/python scripts/bench_ort.py

bench-auto: setup pypi-models
	$(BIN)/python scripts/bench_auto.py

bench-latency: setup pypi-models
	$(BIN)/python scripts/bench_latency.py

# Peak RSS and time of validated conversions of an LLM-sized model (not part of `bench`: it needs
# scripts/build_llm.py's model, several GB of memory and minutes). MODEL=... picks another one.
MODEL ?= models/cache/llm/llama-22x2048/model.onnx
bench-memory: setup
	@test -f $(MODEL) || $(ORTZOOVENV)/bin/python scripts/build_llm.py || \
	  { echo "build it first: make $(ORTZOOVENV)/.installed && $(ORTZOOVENV)/bin/python scripts/build_llm.py"; exit 1; }
	$(BIN)/python scripts/bench_memory.py $(MODEL) --tokens 128,512 --need-gib 10

clean:
	rm -rf out .pytest_cache

bench-startup: setup
	$(BIN)/python scripts/bench_startup.py
