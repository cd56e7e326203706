"""ExecuTorch's package: an extra, installed without its own requirements (its torch pin would
pull another torch), and its LLM kernels' library; what is missing here, in one line."""
from __future__ import annotations

from typing import Optional

from ...errors import UsageError

INSTALL = "pip install -c constraints.txt --no-deps executorch (docs/executorch.md)"


def executorch_missing() -> Optional[str]:
    """Why ExecuTorch cannot run here (its package is an extra, installed without its own
    requirements), or None."""
    try:
        import executorch.runtime  # noqa: F401
    except ImportError as e:
        return f"ExecuTorch is not installed ({e}): {INSTALL}"
    return None


def llm_kernels_missing() -> Optional[str]:
    """Why ExecuTorch's LLM kernels (llama::update_cache, llama::custom_sdpa: the executorch
    wheel's Python-side custom_ops library) cannot be loaded here, or None: they are, as
    torch ops and into the Python runtime."""
    if why := executorch_missing():
        return why
    try:
        from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401
    except (ImportError, OSError, AssertionError) as e:
        return f"ExecuTorch's LLM kernels could not be loaded ({e})"
    return None


def load_llm_kernels() -> None:
    """ExecuTorch's LLM kernels registered (a --kernels llm program's export and run)."""
    if why := llm_kernels_missing():
        raise UsageError(f"--kernels llm: {why}")
