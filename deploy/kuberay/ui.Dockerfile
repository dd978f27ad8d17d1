# The reviewer UI on its own (deploy/kuberay/ui.yaml): `python -m hitl_review.ui` with the [ui] extra, no Ray,
# no torch. It talks to the API over HTTP only. Build from the repository root:
#   docker build -f deploy/kuberay/ui.Dockerfile -t hitl-review-ui:0.1.0 .
# The packages copied are what `python -m hitl_review.ui` imports (tests/test_cluster_packages.py checks them).
FROM python:3.11-slim
RUN useradd --create-home --uid 1000 reviewer
WORKDIR /home/reviewer/hitl-review
COPY --chown=reviewer pyproject.toml README.md ./
COPY --chown=reviewer hitl_review hitl_review
COPY --chown=reviewer statecore statecore
COPY --chown=reviewer client client
COPY --chown=reviewer ui ui
RUN pip install --no-cache-dir '.[ui]'
USER reviewer
EXPOSE 7860
# Every reviewer signs in with a token of their own (HITL_TOKENS on the API): none is baked in here.
ENTRYPOINT ["python", "-m", "hitl_review.ui", "--host", "0.0.0.0", "--port", "7860", "--require-login"]
