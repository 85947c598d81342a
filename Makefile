# AgentVM — two commands set up everything: `make serve` and `make test`.
# Every dependency version comes from uv.lock (`make lock` regenerates it from pyproject.toml);
# each set-up step prints one "[setup] ..." line.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ARGS ?=

# uv installs the locked versions (and writes the lock); itself pinned, installed into $(VENV) with pip.
UV_VERSION ?= 0.13.9
UV := $(BIN)/uv
UV_STAMP := $(VENV)/.uv-$(UV_VERSION)
# sync into $(VENV) whatever venv the shell has active; no uv progress bars in make's output
UV_ENV := UV_PROJECT_ENVIRONMENT="$(abspath $(VENV))" VIRTUAL_ENV= UV_NO_PROGRESS=1
# --locked: refuse (instead of re-resolving) when pyproject.toml and uv.lock disagree: run `make lock`.
# --inexact: keep what the lock does not list (uv itself, pip).
# --compile-bytecode: the .pyc files are written once here; without them every process the suite starts
# (servers, handlers, CLIs) compiles its libraries again where PYTHONDONTWRITEBYTECODE is set (as on CI).
UV_SYNC := $(UV_ENV) $(UV) sync --quiet --locked --inexact --compile-bytecode
# Re-install when the dependencies or their lock change.
LOCK_SUM := $(shell cat pyproject.toml uv.lock 2>/dev/null | cksum | cut -d' ' -f1)
RUNTIME_STAMP := $(VENV)/.runtime-$(LOCK_SUM)
DEV_STAMP := $(VENV)/.dev-$(LOCK_SUM)

.PHONY: serve setup test lint typecheck unit bench clean lock

$(BIN)/python:
	@echo "[setup] creating $(VENV) with $(PYTHON) ($$($(PYTHON) -V 2>&1))"
	@$(PYTHON) -m venv $(VENV)

$(UV_STAMP): $(BIN)/python
	@echo "[setup] installing uv $(UV_VERSION) into $(VENV) (installs the locked dependencies)"
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	@rm -f $(VENV)/.uv-*; touch $@

$(RUNTIME_STAMP): $(UV_STAMP)
	@echo "[setup] installing runtime dependencies into $(VENV) (locked: uv.lock)"
	@$(UV_SYNC) --no-default-groups || { echo "[setup] uv sync failed: after a pyproject.toml change, run 'make lock' (and commit uv.lock)"; exit 1; }
	@rm -f $(VENV)/.runtime-*; touch $@

$(DEV_STAMP): $(UV_STAMP)
	@echo "[setup] installing runtime and dev dependencies into $(VENV) (locked: uv.lock, extra 'dev')"
	@$(UV_SYNC) --no-default-groups --extra dev || { echo "[setup] uv sync failed: after a pyproject.toml change, run 'make lock' (and commit uv.lock)"; exit 1; }
	@rm -f $(VENV)/.dev-* $(VENV)/.runtime-*; touch $@ $(RUNTIME_STAMP)

# The Lambda artifacts' pins (pyproject.toml [dependency-groups]) and the worker image's are exported from the lock.
UV_EXPORT := $(UV_ENV) $(UV) export --frozen --no-hashes --no-header --no-annotate --no-emit-project
LOCK_ARGS ?=
lock: $(UV_STAMP)  ## re-resolve uv.lock after a pyproject.toml change (LOCK_ARGS=--upgrade for newest) and re-export the pins
	$(UV_ENV) $(UV) lock $(LOCK_ARGS)
	@{ sed -n '/^# /p;/^$$/q' shared/requirements.txt; echo; $(UV_EXPORT) --only-group layer; } > shared/requirements.txt.new
	@mv shared/requirements.txt.new shared/requirements.txt
	@{ sed -n '/^# /p;/^$$/q' functions/chat_stream/requirements.txt; echo; $(UV_EXPORT) --only-group chat-stream --no-emit-package h11; } \
		> functions/chat_stream/requirements.txt.new
	@mv functions/chat_stream/requirements.txt.new functions/chat_stream/requirements.txt
	@{ sed -n '/^# /p;/^$$/q' infra/container/constraints.txt; echo; $(UV_EXPORT) --no-default-groups --extra aws --extra otel; } \
		> infra/container/constraints.txt.new
	@mv infra/container/constraints.txt.new infra/container/constraints.txt
	@echo "uv.lock and its exports (shared/requirements.txt, functions/chat_stream/requirements.txt," \
		"infra/container/constraints.txt) are up to date"

serve: $(RUNTIME_STAMP)  ## run avm serve on 127.0.0.1:8080 (data in ~/.agentvm); extra flags via ARGS=...
	$(BIN)/avm serve $(ARGS)

lint: $(DEV_STAMP)  ## ruff, and the import rules of pyproject.toml's [tool.importlinter] (docs/architecture.md)
	$(BIN)/ruff check shared local client tests functions
	@# this tree's packages, whichever checkout the venv's editable install points at
	PYTHONPATH=shared:local:client$${PYTHONPATH:+:$$PYTHONPATH} $(BIN)/lint-imports --no-logo

typecheck: $(DEV_STAMP)
	$(BIN)/mypy
	@# each Lambda handler is its own top-level module `handler`: checked one at a time
	@for f in functions/*/handler.py; do $(BIN)/mypy $$f || exit 1; done

# Three workers, whatever the machine (CI has 2 cores): the suite waits on subprocesses, sockets and
# moto as much as it computes, so two workers left a quarter of the 2 cores idle (149 % CPU, 9 min 22 s;
# three: 178 %, 7 min 50 s); worksteal evens out the few long tests.
PYTEST_WORKERS ?= 3
unit: $(DEV_STAMP) sam-cli system-packages focus-validator mcp-servers
	@# this tree's bytecode, written once (changed files only) for the hundreds of processes the suite starts
	@$(BIN)/python -m compileall -q -j 0 shared local client functions tests
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist worksteal

# The five set-ups are independent and mostly wait on downloads: built side by side on a fresh clone.
setup:
	@$(MAKE) --no-print-directory -j5 dev-deps sam-cli system-packages focus-validator mcp-servers

.PHONY: dev-deps
dev-deps: $(DEV_STAMP)
	@:

test: setup  ## install dev dependencies, lint, type-check and run the whole suite
	@$(MAKE) --no-print-directory lint
	@# mypy (~35 s of CPU) runs beside the suite, which leaves part of the cores idle while it waits on
	@# processes and sockets; its report is printed after the suite's, and either failing fails `make test`
	@mkdir -p .artifacts; echo 1 > .artifacts/typecheck.rc; echo "[typecheck] running beside the suite"; \
	{ $(MAKE) --no-print-directory typecheck > .artifacts/typecheck.log 2>&1; echo $$? > .artifacts/typecheck.rc; } & \
	$(MAKE) --no-print-directory unit; suite=$$?; wait; \
	echo "[typecheck] its output (.artifacts/typecheck.log):"; cat .artifacts/typecheck.log; \
	test "$$suite" = 0 && test "$$(cat .artifacts/typecheck.rc)" = 0

bench: $(DEV_STAMP)  ## full benchmarks; results go to docs/benchmarks.md and docs/cost-model.md by hand
	@# "-": the http_api and chat_stream cold-import ratios (FastAPI) miss 2.5x (docs/benchmarks.md); the others still run
	-$(BIN)/python -m tests.bench.run $(ARGS)
	$(BIN)/python -m tests.bench.many_clients --json .bench/many-clients.json
	$(BIN)/python -m tests.bench.storm --json .bench/storm.json
	$(BIN)/python -m tests.bench.token_gateway --json .bench/token-gateway.json
	@# "-": the AWS-calls limits (8 write units a turn) are not met yet; the host bench and the model still run
	-$(BIN)/python -m tests.bench.aws_calls --json .bench/aws-calls.json
	$(BIN)/python -m tests.bench.turn_host --json .bench/turn-host.json --into .bench/aws-calls.json
	$(BIN)/python -m tests.bench.cost_model --counts .bench/aws-calls.json --json .bench/cost-model.json

clean:
	rm -rf $(VENV) $(FOCUS_VENV) .mypy_cache .ruff_cache .pytest_cache .import_linter_cache

# --- tools with their own venvs (pins that conflict with .venv's) ------------------------------------
# The versions of each venv are pinned by constraints/<tool>.txt, a pip freeze of a working venv:
# `make lock-tools` rebuilds both venvs unpinned (newest versions the tool allows) and re-freezes them.
TOOL_PINS ?= 1
tool_pins = $(if $(filter 1,$(TOOL_PINS)),--constraint constraints/$(1).txt)
tool_pins_said = $(if $(filter 1,$(TOOL_PINS)),pinned: constraints/$(1).txt,unpinned: newest versions)
# pip too: the bundled one of `python -m venv` is older than the pinned one
UV_TOOL_INSTALL := $(UV_ENV) $(UV) pip install --quiet --compile-bytecode --upgrade-package pip
freeze_into = { sed -n '/^\# /p;/^$$/q' constraints/$(2).txt; echo; $(1)/bin/python -m pip freeze --all \
	--disable-pip-version-check | grep -v -i -E '^(setuptools|wheel)=='; } > constraints/$(2).txt.new && \
	mv constraints/$(2).txt.new constraints/$(2).txt

.PHONY: lock-tools
lock-tools: $(UV_STAMP)  ## re-pin the SAM CLI and FOCUS validator venvs (constraints/*.txt)
	rm -rf $(SAM_VENV) $(FOCUS_VENV)
	$(MAKE) --no-print-directory $(SAM_STAMP) $(FOCUS_STAMP) TOOL_PINS=0
	@$(call freeze_into,$(SAM_VENV),sam-cli)
	@$(call freeze_into,$(FOCUS_VENV),focus-validator)

# --- AWS SAM CLI (template checks and `sam build`) ------------------------------------------------
# The SAM CLI lives in its own virtualenv: its boto3 pin conflicts with aioboto3's in $(VENV).
# Python 3.12 (the Lambda runtime) when one runs, else $(PYTHON). pyenv shims exist but fail when the
# version is not selected, so every candidate is tried, not just looked up.
SAM_VENV ?= .venv-sam
SAM_CLI_VERSION ?= 1.170.0
SAM := $(SAM_VENV)/bin/sam
SAM_STAMP := $(SAM_VENV)/.aws-sam-cli-$(SAM_CLI_VERSION)
SAM_PYTHON ?= $(shell for p in "$$(command -v python3.12)" \
	$$(ls -d "$$(pyenv root 2>/dev/null || echo "$$HOME/.pyenv")"/versions/3.12*/bin/python3.12 2>/dev/null) \
	"$(PYTHON)"; do [ -n "$$p" ] && "$$p" -c '' 2>/dev/null && { echo "$$p"; break; }; done)
# No telemetry and no instance-metadata probing; neither command needs AWS credentials. The SAM venv's
# bin comes first on PATH because `sam build` (no container) looks for a working `python3.12` there.
SAM_ENV := PATH="$(abspath $(SAM_VENV))/bin:$$PATH" SAM_CLI_TELEMETRY=0 AWS_EC2_METADATA_DISABLED=true \
	AWS_DEFAULT_REGION=$${AWS_DEFAULT_REGION:-us-east-1}

.PHONY: sam-cli sam-validate sam-build template clean-sam

$(SAM): $(SAM_STAMP)

# Its versions: constraints/sam-cli.txt (`make lock-tools`). Installed by the uv of $(VENV) (seconds, not minutes);
# pip stays in the venv: shared/Makefile builds the layer with this venv's python3.12 -m pip.
$(SAM_STAMP): $(UV_STAMP)
	@test -n "$(SAM_PYTHON)" || { echo "no Python interpreter found for the SAM CLI venv"; exit 1; }
	@echo "[setup] creating $(SAM_VENV) with aws-sam-cli $(SAM_CLI_VERSION) ($(call tool_pins_said,sam-cli))"
	@$(SAM_PYTHON) -m venv $(SAM_VENV)
	@$(UV_TOOL_INSTALL) --python $(SAM_VENV)/bin/python $(call tool_pins,sam-cli) pip aws-sam-cli==$(SAM_CLI_VERSION)
	@rm -f $(SAM_VENV)/.aws-sam-cli-*; touch $@

# Best effort: `make test` still runs (the template tests then skip `sam validate` with the reason).
sam-cli: $(UV_STAMP)
	@$(MAKE) --no-print-directory --silent $(SAM) || echo "SAM CLI venv could not be built (no Python or no PyPI access?): \
	tests/template will skip 'sam validate'"

sam-validate: $(SAM)  ## sam validate --lint (cfn-lint through the SAM CLI); needs no AWS credentials
	$(SAM_ENV) $(SAM) validate --lint --template template.yaml

sam-build: $(SAM)  ## sam build without a container: arm64 wheels come from PyPI, output in .aws-sam/
	$(SAM_ENV) $(SAM) build --template template.yaml --parallel --cached

template: $(DEV_STAMP) sam-cli  ## only the template tests (cfn-lint, sam validate, structure)
	$(BIN)/pytest -q tests/template

clean-sam:
	rm -rf $(SAM_VENV) .aws-sam

# --- FOCUS validator (tests/billing validates the FOCUS 1.0 usage export) --------------------------
# The official focus-validator lives in its own virtualenv: its pandas/pandera/pydantic pins are not ours.
# 1.0.0 is the newest release that validates FOCUS 1.0 offline (2.x needs Python 3.12, bundles only the
# FOCUS 1.2 rules and fetches others from GitHub releases). Its pandera 0.17 needs an old multimethod
# (2.x dropped `overload`).
# Not best effort: tests/billing fails, with the reason, when the venv is missing.
FOCUS_VENV ?= .venv-focus
FOCUS_VALIDATOR_VERSION ?= 1.0.0
FOCUS_VALIDATOR := $(FOCUS_VENV)/bin/focus-validator
FOCUS_STAMP := $(FOCUS_VENV)/.focus-validator-$(FOCUS_VALIDATOR_VERSION)

.PHONY: focus-validator clean-focus

$(FOCUS_VALIDATOR): $(FOCUS_STAMP)

$(FOCUS_STAMP): $(UV_STAMP)
	@echo "[setup] creating $(FOCUS_VENV) with focus-validator $(FOCUS_VALIDATOR_VERSION) ($(call tool_pins_said,focus-validator))"
	@$(PYTHON) -m venv $(FOCUS_VENV)
	@$(UV_TOOL_INSTALL) --python $(FOCUS_VENV)/bin/python $(call tool_pins,focus-validator) \
		pip focus_validator==$(FOCUS_VALIDATOR_VERSION) 'multimethod<1.11'
	@rm -f $(FOCUS_VENV)/.focus-validator-*; touch $@

focus-validator: $(FOCUS_VALIDATOR)  ## the FOCUS validator venv .venv-focus (tests/billing needs it)
	@:

clean-focus:
	rm -rf $(FOCUS_VENV)

# --- system packages: bubblewrap (the tool sandbox: agentvm/adapters/local/local_process.py),
# chromium (the web console's browser tests: tests/console), Node.js and npm (the Node MCP server's
# tests: tests/tools/test_mcp_packages.py) ---------------------------------------------------------
# Best effort, like sam-cli: `make test` still runs (tests/sandbox then skips the bubblewrap checks, and
# tests/console and the Node MCP tests theirs, each with the reason). Installs only what is missing, only as root
# with apt, in one apt-get (two at once would fight over apt's lock). Without bubblewrap `avm serve`
# refuses sandbox tools unless it runs as root (docs/security.md).
.PHONY: system-packages bubblewrap

SYSTEM_PACKAGES = $(if $(shell command -v bwrap),,bubblewrap) $(if $(shell command -v chromium),,chromium) \
	$(if $(shell command -v node),,nodejs) $(if $(shell command -v npm),,npm)

system-packages:
	@[ -z "$(strip $(SYSTEM_PACKAGES))" ] || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		echo "[setup] apt-get install $(strip $(SYSTEM_PACKAGES)) (system-wide, as root; the only system packages make installs)" && \
		{ DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSTEM_PACKAGES) >/dev/null 2>&1 || \
		  { apt-get update -qq >/dev/null 2>&1 && \
		    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSTEM_PACKAGES) >/dev/null 2>&1; }; }; } || \
		echo "$(strip $(SYSTEM_PACKAGES)) could not be installed (not root, no apt or no network?): the tests that need them skip"

bubblewrap: system-packages

# --- MCP server packages (tests/tools/test_mcp_packages.py runs them in the sandbox) ------------------
# Best effort, like bubblewrap: without them the tests of real MCP server packages skip with the reason.
# A sandboxed tool sees /usr and its workspace, not /opt or /home (docs/security.md), so as root they are
# installed under /usr/local (the README's MCP example); otherwise into .mcp-servers/ here, which the test
# copies into a workspace. Each installed once: its package.json (npm) or a stamp in its venv says which
# version is there. Node: the MCP project's test server, from npm. Python: mcp-server-time, from PyPI, in
# a venv of /usr/bin/python3 (the interpreter must be under /usr too), installed by our uv.
MCP_EVERYTHING := @modelcontextprotocol/server-everything
MCP_EVERYTHING_VERSION ?= 2026.8.31
MCP_TIME_VERSION ?= 2026.10.19
MCP_PREFIX ?= $(if $(filter 0,$(shell id -u)),/usr/local,$(abspath .mcp-servers))
MCP_TIME_VENV := $(MCP_PREFIX)/lib/mcp-server-time
.PHONY: nodejs mcp-servers mcp-node-server mcp-python-server

nodejs: system-packages

mcp-servers: mcp-node-server mcp-python-server

mcp-node-server: nodejs
	@grep -qs '"version": "$(MCP_EVERYTHING_VERSION)"' \
		"$(MCP_PREFIX)/lib/node_modules/$(MCP_EVERYTHING)/package.json" || { command -v npm >/dev/null 2>&1 && \
		echo "[setup] npm install -g --prefix $(MCP_PREFIX) $(MCP_EVERYTHING)@$(MCP_EVERYTHING_VERSION)$(if \
			$(filter /usr/%,$(MCP_PREFIX)), (system-wide; an MCP server the sandbox can see))" && \
		umask 022 && npm install -g --prefix "$(MCP_PREFIX)" --no-audit --no-fund --no-update-notifier \
			--loglevel=error "$(MCP_EVERYTHING)@$(MCP_EVERYTHING_VERSION)" >/dev/null; } || \
		echo "$(MCP_EVERYTHING) could not be installed (no npm or no network?): the Node MCP server tests skip"

mcp-python-server: $(UV_STAMP)
	@grep -qsx 'mcp-server-time==$(MCP_TIME_VERSION)' "$(MCP_TIME_VENV)/.installed" || { [ -x /usr/bin/python3 ] && \
		echo "[setup] a venv of /usr/bin/python3 in $(MCP_TIME_VENV) with mcp-server-time $(MCP_TIME_VERSION)$(if \
			$(filter /usr/%,$(MCP_PREFIX)), (system-wide; an MCP server the sandbox can see))" && \
		umask 022 && rm -rf "$(MCP_TIME_VENV)" && \
		$(UV_ENV) $(UV) venv --quiet --python /usr/bin/python3 "$(MCP_TIME_VENV)" && \
		$(UV_ENV) $(UV) pip install --quiet --link-mode copy --python "$(MCP_TIME_VENV)/bin/python" \
			"mcp-server-time==$(MCP_TIME_VERSION)" && \
		echo 'mcp-server-time==$(MCP_TIME_VERSION)' > "$(MCP_TIME_VENV)/.installed"; } || \
		echo "mcp-server-time could not be installed (no /usr/bin/python3 or no network?): its test skips"
