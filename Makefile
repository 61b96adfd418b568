# fedshard: `make demo` and `make test` work on a fresh machine (they create .venv).
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export FLWR_TELEMETRY_ENABLED := 0
export FLWR_DISABLE_UPDATE_CHECK := 1
export GRPC_VERBOSITY := ERROR

.PHONY: demo demo-flower test test-fast test-readme test-containers test-hosts lint proto bench bench-dp report-images clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch is pinned and installed first: a CPU build of 2.13.0 lies on this machine's disk,
# while an unpinned `torch` would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,simulation,demo]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/fedshard simulate --config configs/demo.yaml

demo-flower: $(STAMP)
	$(BIN)/fedshard simulate --config configs/demo.yaml --engine flower

# The suite on TEST_WORKERS pytest-xdist workers: tests that start Ray, and tests that deploy a
# federation, each run on one worker one after the other (tests/time_budget.py's GROUPS).
TEST_WORKERS ?= 3
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

# Torch on one thread in every test process: three workers on two cores, each torch process
# with a thread per core, spent a sixth of the suite's CPU time on threads waiting for each
# other (the suite: 19:50 against 23:50 on 2 cores). Set OMP_NUM_THREADS to override.
test test-fast test-readme: export OMP_NUM_THREADS ?= 1

test: $(STAMP)
	$(PYTEST)

test-fast: $(STAMP)
	$(PYTEST) -m "not slow"

# Every README block as pasted after `make demo`, in order, slow ones too (the LLM demo, two
# deployments: about 8 minutes on 2 cores); prints each block's wall time
test-readme: $(STAMP)
	FEDSHARD_README_SLOW=1 FEDSHARD_TEST_BUDGET_S=0 $(BIN)/python -m pytest -q -s \
		tests/integration/test_readme.py::test_every_block_runs_as_pasted

# The image (Dockerfile) and the compose federation (deploy/compose.yaml) run to completion in
# Docker, one site killed mid-run; Debian's docker.io, docker-compose and debootstrap are installed
# when missing (no registry is needed: the base is made from Debian's packages)
test-containers: $(STAMP)
	command -v dockerd >/dev/null && command -v docker-compose >/dev/null && command -v debootstrap >/dev/null \
		|| DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io docker-compose debootstrap
	FEDSHARD_CONTAINERS=1 FEDSHARD_TEST_BUDGET_S=0 $(BIN)/python -m pytest -q -s tests/containers

# The README's "On separate hosts" blocks, each party on its own host: network namespaces with
# their own addresses and names, links shaped with tc tbf (Debian's iproute2 and iptables are
# installed when missing; needs root)
test-hosts: $(STAMP)
	command -v ip >/dev/null && command -v tc >/dev/null && command -v iptables >/dev/null \
		|| DEBIAN_FRONTEND=noninteractive apt-get install -y -q iproute2 iptables
	FEDSHARD_HOSTS=1 FEDSHARD_TEST_BUDGET_S=0 $(BIN)/python -m pytest -q -s tests/hosts

lint: $(STAMP)
	$(BIN)/ruff check fedshard server clients tests bench
	$(BIN)/ruff format --check fedshard server clients tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. fedshard/zone/rpc/zone.proto

bench: $(STAMP)
	$(BIN)/python bench/zone_accumulate.py
	$(BIN)/python bench/upload.py
	$(BIN)/python bench/zone_memory.py

# DP utility: 45 folds x 12 runs of real federations (about an hour on 2 cores with --jobs 2),
# then the large-model task's DP gap with its rate chosen on validation data (about 30 minutes)
bench-dp: $(STAMP)
	$(BIN)/python bench/dp_tables.py --processes 2
	$(BIN)/python bench/dp_clips.py
	$(BIN)/python bench/dp_accuracy.py --jobs 2
	$(BIN)/python bench/llm_dp.py

# The README's plots: the demo's and the DP demo's reports (`fedshard report`), written to
# docs/report and docs/report/dp, and screenshots of both pages (headless Chromium)
report-images: $(STAMP)
	rm -rf runs/report-images runs/report-images-dp
	$(BIN)/fedshard simulate --config configs/demo.yaml --out runs/report-images
	$(BIN)/fedshard report runs/report-images --out docs/report
	$(BIN)/fedshard simulate --config configs/demo-dp.yaml --out runs/report-images-dp
	$(BIN)/fedshard report runs/report-images-dp --out docs/report/dp
	$(BIN)/python docs/report/screenshots.py docs/report/report.html docs/report/demo-page.png \
		docs/report/dp/report.html docs/report/dp-page.png

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
