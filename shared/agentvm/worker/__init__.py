"""The container task's worker: `python -m agentvm.worker` (infra/container/Dockerfile)."""
