# The image deploy/ runs: `docker build -t mpsched:0.1.0 .`
FROM python:3.11-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY extender ./extender
RUN pip install --no-cache-dir ".[fast]" && rm -rf /src
USER 65532:65532
ENTRYPOINT ["mpsched"]
