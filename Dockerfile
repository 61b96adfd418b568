# One image for every fedshard role: `aggregator up`, `zone up`, `site up` (and any other command).
#
#   docker build -t fedshard .                                         # python:3.11-slim, torch's CPU build
#   docker run --rm fedshard --help
#
# Build arguments:
#   BASE        the base image; python:3.11-slim, or any Debian-like image with python3.11 and venv
#   TORCH       the torch requirement (default torch==2.13.0)
#   TORCH_PIP   where pip takes torch from (default: the CPU index of download.pytorch.org; an
#               unpinned index would pull the multi-GB CUDA build)
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST: a package mirror, if pip must use one
#
# Keys and state are volumes, never baked in: keys are read from /keys, state goes to /state
# (see deploy/compose.yaml). The process runs as the unprivileged user `fedshard` (uid 10001).
ARG BASE=python:3.11-slim

FROM ${BASE} AS build
ARG TORCH=torch==2.13.0
ARG TORCH_PIP="--index-url https://download.pytorch.org/whl/cpu"
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/fedshard \
    && /opt/fedshard/bin/pip install --quiet $TORCH_PIP "$TORCH"
# the dependencies first, from pyproject.toml alone: a change to the code reuses this layer
COPY pyproject.toml README.md /src/
RUN mkdir -p /src/fedshard /src/server /src/clients \
    && touch /src/fedshard/__init__.py /src/server/__init__.py /src/clients/__init__.py \
    && /opt/fedshard/bin/pip install --quiet /src \
    && /opt/fedshard/bin/pip uninstall --quiet --yes fedshard \
    && rm -rf /src/fedshard /src/server /src/clients
COPY fedshard /src/fedshard
COPY server /src/server
COPY clients /src/clients
RUN rm -rf /src/build /src/*.egg-info \
    && /opt/fedshard/bin/pip install --quiet --no-deps /src \
    && find /opt/fedshard -name '__pycache__' -prune -exec rm -rf {} + \
    && rm -rf /opt/fedshard/lib/python3.11/site-packages/torch/include \
    && /opt/fedshard/bin/python -c "import torch, opacus, tenseal, flwr, fedshard.cli.main; \
assert torch.version.cuda is None, 'torch is a CUDA build: pass TORCH_PIP with a CPU index'"

FROM ${BASE}
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin fedshard \
    && mkdir -p /keys /state \
    && chown fedshard:fedshard /state
COPY --from=build /opt/fedshard /opt/fedshard
ENV PATH=/opt/fedshard/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    FLWR_TELEMETRY_ENABLED=0 \
    FLWR_DISABLE_UPDATE_CHECK=1 \
    GRPC_VERBOSITY=ERROR \
    OMP_NUM_THREADS=1
USER fedshard
WORKDIR /state
ENTRYPOINT ["fedshard"]
CMD ["--help"]
