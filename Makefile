# The two commands a new user needs: `make demo` (the main job on the shipped default model) and
# `make test`. Both set up .venv first; `make setup` is idempotent and takes seconds when done.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
export MUJOCO_GL ?= egl
export FASTDDS_BUILTIN_TRANSPORTS ?= LARGE_DATA
export PYTHONUNBUFFERED := 1

.PHONY: setup test demo bench clean
setup:
	@tools/setup.sh

test: setup
	$(PY) -m pytest test -q

demo: setup
	$(VENV)/bin/iws demo

bench: setup
	$(VENV)/bin/iws bench reference --json

clean:
	rm -rf $(VENV) build
