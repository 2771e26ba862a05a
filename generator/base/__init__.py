"""The bottom layer: errors, side files and atomic writes, fan-out over nodes, sizes, verdicts,
file manifests, how a container and a starting vLLM are read, NCCL's log lines, the health tool's
commands. It imports nothing else of the tool."""
