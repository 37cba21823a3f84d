.PHONY: install test lint bench

install:
	python3 -m venv .venv && .venv/bin/pip install -e '.[dev]'

test:
	.venv/bin/pytest

lint:
	.venv/bin/ruff format --check wf_magic tests bench
	.venv/bin/ruff check wf_magic tests bench
	.venv/bin/mypy

bench:
	.venv/bin/python bench/engine_overhead.py
	.venv/bin/python bench/frames.py --attempts 200000
