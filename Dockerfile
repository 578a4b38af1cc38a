# The image deploy/ runs, built and tagged by `scripts/release build` (docs/releasing.md).
#
# Reproducible: the base image is pinned (an exact Python and Debian release; `scripts/release
# pin-base` adds the digest it resolves, and `scripts/release build` refuses a base without
# one), and every Python package comes from a lock with hashes: requirements.lock (the runtime
# dependencies and the `fast` extra, uvloop, locked from pyproject.toml) and
# requirements-build.lock (setuptools and mypy, which compiles the decision core), both made
# by `scripts/release lock`. pip installs them with --require-hashes and --no-deps: nothing is
# resolved at build time, so two builds of one commit install the same files.
#
# Two stages: the first builds the mpsched wheel, its decision core compiled with mypyc
# (MPSCHED_COMPILE=1; extender/build.py lists the modules and says why), in a build
# environment of its own with a C compiler, and installs it with the locked dependencies into
# a virtual environment; the second copies that environment alone onto a fresh base, so the
# image carries no compiler, no pip, no setuptools, no mypy, no sources and no build cache. The
# `simulate` extra (numpy, matplotlib) is for `mpsched simulate` on a workstation, not serving.
FROM python:3.11.13-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN apt-get update \
 && apt-get install --yes --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY requirements.lock requirements-build.lock ./
RUN python -m venv /opt/build \
 && /opt/build/bin/pip install --require-hashes --no-deps --only-binary=:all: -r requirements-build.lock \
 && python -m venv /opt/mpsched \
 && /opt/mpsched/bin/pip install --require-hashes --no-deps --only-binary=:all: -r requirements.lock
COPY pyproject.toml setup.py README.md LICENSE ./
COPY tools ./tools
COPY extender ./extender
RUN MPSCHED_COMPILE=1 /opt/build/bin/pip wheel --no-deps --no-build-isolation --no-index --wheel-dir /wheels "." \
 && /opt/mpsched/bin/pip install --no-deps --no-index /wheels/mpsched-*.whl \
 && /opt/mpsched/bin/pip check \
 && /opt/mpsched/bin/pip uninstall --yes pip setuptools \
 && /opt/mpsched/bin/python -c "import extender.cli, extender.kube.api, extender.commands.agent" \
 && /opt/mpsched/bin/python -c "import extender.build as b; assert b.build() == 'mypyc', b.compiled_modules()"

FROM python:3.11.13-slim-bookworm
# The base image's own pip and setuptools are build tools too; nothing at run time needs them.
RUN python -m pip uninstall --yes pip setuptools wheel \
 && rm -rf /root/.cache
COPY --from=build /opt/mpsched /opt/mpsched
COPY LICENSE /usr/share/doc/mpsched/LICENSE
ENV PATH=/opt/mpsched/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# Numeric, so that a Pod's `runAsNonRoot: true` can be verified without an /etc/passwd entry.
USER 65532:65532
ENTRYPOINT ["mpsched"]
