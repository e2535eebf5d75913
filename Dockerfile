# The runtime image of planner's launch files (k8s/pytorchjob.yaml runs it; slurm/job.sbatch can run in it
# through a container plugin): CUDA PyTorch, then this project with its runtime extra.
#
#   docker build -t REGISTRY/planner-runtime:TAG .
#   planner compile ... --image REGISTRY/planner-runtime:TAG     (or PLANNER_IMAGE at launch)
#
# The base image's PyTorch is the runtime extra's pin (torch==2.13.0), so pip keeps it; its tag names the
# CUDA build (PyPI's torch 2.13.0 wheels are CUDA 13.0). Another base: --build-arg BASE_IMAGE=...
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime
FROM ${BASE_IMAGE}

WORKDIR /opt/planner
COPY pyproject.toml README.md ./
COPY models ./models
COPY hardware ./hardware
COPY planner ./planner
RUN python -m pip install --no-cache-dir ".[runtime]"

# the launch files run the trainer from the plan folder, mounted or copied here
WORKDIR /workspace
