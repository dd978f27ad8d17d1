# syntax=docker/dockerfile:1
# The archive's migration Job (deploy/kuberay/archive-migrate.yaml): `python -m hitl_review.archive.migrate`
# on a slim CPU image, no Ray, no torch, no GPU. Build from the repository root:
#   docker build -f deploy/kuberay/migrate.Dockerfile -t hitl-review-migrate:0.2.0 .
# The requirements below are the server extra's own lines for the archive (tests/test_deploy_manifests.py
# checks that they are, and that they hold every distribution the migrations import).
FROM python:3.11-slim AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY hitl_review hitl_review
COPY archive archive
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --create-home --uid 1000 --user-group migrate
# Every version from constraints.txt (the tested .venv's): a later build installs the same.
RUN --mount=type=bind,from=wheel,source=/wheels,target=/tmp/wheels --mount=type=bind,source=constraints.txt,target=/tmp/constraints.txt \
    set -- /tmp/wheels/hitl_review-*.whl \
 && pip install --no-cache-dir -c /tmp/constraints.txt "$1" 'sqlalchemy>=2.0' 'alembic>=1.13' 'psycopg[binary]>=3.1'
USER 1000
WORKDIR /home/migrate
ENTRYPOINT ["python", "-m", "hitl_review.archive.migrate"]
