# One image for every role: the role is the first argument.
#   docker build -t REGISTRY/impala-league:TAG .
#   docker run --init -e IMPALA_REDIS_URL REGISTRY/impala-league:TAG actor --config configs/connect_four.yaml
#
# Build arguments:
#   TORCH_INDEX  a pip index to take torch from before requirements.txt is installed. Empty (the default):
#                torch==2.13.0 as requirements.txt pins it, from the default index. PyTorch publishes an
#                index per build: its CPU-only index (.../whl/cpu) gives small actor images, a CUDA one
#                (.../whl/cu128 for CUDA 12.8) the learner's; requirements.txt's pin is then already met.
#   TORCH_SPEC   the torch requirement taken from TORCH_INDEX (default torch==2.13.0, the pinned version).
#   SC2          non-empty (SC2=1): also pysc2 (requirements-sc2.txt), for the sc2:<map> envs; the game itself is
#                not in the image (its licence): mount a StarCraft II folder at $SC2PATH (/opt/StarCraftII).
#                Every other env of the README (boards, MPE, MAgent2, POPGym, Atari with its ROMs) is in
#                requirements.txt, in every image.
FROM python:3.11.13-slim-bookworm

ARG TORCH_INDEX=""
ARG TORCH_SPEC="torch==2.13.0"
ARG SC2=""

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    SC2PATH=/opt/StarCraftII

WORKDIR /app

# Requirements first: this layer is rebuilt only when they change, not on every code change. pysc2 goes in
# without its declared dependencies (requirements-sc2.txt says why); those it uses are in requirements.txt.
COPY requirements.txt requirements-sc2.txt ./
RUN if [ -n "$TORCH_INDEX" ]; then pip install --index-url "$TORCH_INDEX" "$TORCH_SPEC"; fi \
    && pip install -r requirements.txt \
    && if [ -n "$SC2" ]; then pip install --no-deps -r requirements-sc2.txt; fi

COPY . .

# The code stays root's (read-only to the roles); runs/ is the one place they write (mount a volume there).
RUN useradd --create-home --uid 10001 --user-group impala \
    && mkdir -p /app/runs \
    && chown impala:impala /app/runs
USER impala

ENTRYPOINT ["python", "/app/run.py"]
CMD ["--help"]
