# Entry point for users: `make demo` runs the pipeline end to end, `make test`
# runs the test suite. Both install missing Debian packages first (apt-get, as
# root or through sudo), then configure and build with meson.

BUILD ?= build
DATA ?= ../shared/data
OUT ?= out
SANITIZE ?=
MESON_OPTS ?=
# Warnings are errors in CI (CI=true is set there).
ifneq ($(CI),)
MESON_OPTS += -Dwerror=true
endif
ifneq ($(SANITIZE),)
MESON_OPTS += -Db_sanitize=$(SANITIZE) -Db_lundef=false -Dbuildtype=debugoptimized
endif

PKGS = build-essential meson ninja-build pkg-config libhdf5-dev hdf5-tools \
       libzstd-dev libxxhash-dev liburing-dev libpng-dev libcriterion-dev bzip2

# Only `make bench` needs these (bench/placer/quality.sh reads --json with jq).
BENCH_PKGS = jq

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps build test demo bench clean

all: build

# Installs only what is missing, so a configured machine does not touch apt.
deps:
	@missing=""; for p in $(PKGS) $(EXTRA_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "Installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(BUILD)/build.ninja:
	meson setup $(BUILD) -Ddata_dir=$(abspath $(DATA)) $(MESON_OPTS)

build: deps $(BUILD)/build.ninja
	ninja -C $(BUILD)

test: build
	meson test -C $(BUILD) --print-errorlogs --num-processes 2 -t 4

demo: build
	BUILD=$(BUILD) DATA=$(DATA) OUT=$(OUT) sh scripts/demo.sh

bench: EXTRA_PKGS = $(BENCH_PKGS)
bench: build
	BUILD=$(BUILD) DATA=$(DATA) sh bench/run.sh

clean:
	rm -rf $(BUILD) $(OUT)
