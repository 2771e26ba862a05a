"""vllm-compose: per-node Docker Compose stacks for one vLLM model served across several nodes."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("vllm-compose")
except PackageNotFoundError:  # running from a checkout that was never installed
    __version__ = "0.0.0+checkout"
