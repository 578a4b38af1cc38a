# The image deploy/ runs: `docker build -t mpsched:0.1.0 .`
#
# Two stages: the first builds mpsched into a virtual environment, its decision core compiled
# with mypyc (MPSCHED_COMPILE=1; extender/build.py lists the modules and says why), which
# needs a C compiler there and only there; the second copies that environment alone onto a
# fresh base, so the image carries no compiler, no pip, no setuptools, no sources and no build
# cache. `pip install .` installs no extra but `fast` (uvloop): the `simulate` extra (numpy,
# matplotlib, Pillow) is for `mpsched simulate` on a workstation, not for serving. The
# dependencies come as wheels only.
FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN apt-get update \
 && apt-get install --yes --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE ./
COPY tools ./tools
COPY extender ./extender
RUN python -m venv /opt/mpsched \
 && MPSCHED_COMPILE=1 /opt/mpsched/bin/pip install --only-binary=:all: ".[fast]" \
 && /opt/mpsched/bin/pip uninstall --yes pip setuptools \
 && /opt/mpsched/bin/python -c "import extender.cli, extender.kube.api, extender.agent.cli" \
 && /opt/mpsched/bin/python -c "import extender.build as b; assert b.build() == 'mypyc', b.compiled_modules()"

FROM python:3.11-slim
# The base image's own pip and setuptools are build tools too; nothing at run time needs them.
RUN python -m pip uninstall --yes pip setuptools wheel \
 && rm -rf /root/.cache
COPY --from=build /opt/mpsched /opt/mpsched
COPY LICENSE /usr/share/doc/mpsched/LICENSE
ENV PATH=/opt/mpsched/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# Numeric, so that a Pod's `runAsNonRoot: true` can be verified without an /etc/passwd entry.
USER 65532:65532
ENTRYPOINT ["mpsched"]
