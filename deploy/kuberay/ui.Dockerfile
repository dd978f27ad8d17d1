# syntax=docker/dockerfile:1
# The reviewer UI on its own (deploy/kuberay/ui.yaml): `python -m hitl_review.ui` with the [ui] extra, no Ray,
# no torch. It talks to the API over HTTP only. Build from the repository root:
#   docker build -f deploy/kuberay/ui.Dockerfile -t hitl-review-ui:0.2.0 .
# The first stage builds the project's wheel from the packages the UI imports (tests/test_cluster_packages.py
# checks them); the image installs that wheel alone and keeps no sources beside it.
FROM python:3.11-slim AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY hitl_review hitl_review
COPY statecore statecore
COPY client client
COPY ui ui
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --create-home --uid 1000 --user-group reviewer
# Every version from constraints.txt (the tested .venv's): a later build installs the same.
RUN --mount=type=bind,from=wheel,source=/wheels,target=/tmp/wheels --mount=type=bind,source=constraints.txt,target=/tmp/constraints.txt \
    set -- /tmp/wheels/hitl_review-*.whl && pip install --no-cache-dir -c /tmp/constraints.txt "$1[ui]"
USER 1000
WORKDIR /home/reviewer
EXPOSE 7860
# Every reviewer signs in with a token of their own (HITL_TOKENS on the API): none is baked in here.
ENTRYPOINT ["python", "-m", "hitl_review.ui"]
CMD ["--host", "0.0.0.0", "--port", "7860", "--require-login"]
