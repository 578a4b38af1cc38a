# The image deploy/ runs: `docker build -t mpsched:0.1.0 .`
#
# Two stages: the first installs mpsched and its runtime dependencies into a virtual
# environment (wheels only: no compiler is needed, and none is there); the second copies that
# environment alone onto a fresh base, so the image carries no pip, no setuptools, no sources
# and no build cache. `pip install .` installs no extra but `fast` (uvloop): the `simulate` extra
# (numpy, matplotlib, Pillow) is for `mpsched simulate` on a workstation, not for serving.
FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY extender ./extender
RUN python -m venv /opt/mpsched \
 && /opt/mpsched/bin/pip install --only-binary=:all: ".[fast]" \
 && /opt/mpsched/bin/pip uninstall --yes pip setuptools \
 && /opt/mpsched/bin/python -c "import extender.cli, extender.kube.api, extender.agent.cli"

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
