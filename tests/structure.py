"""Where the package names an attention kind or a lossy step, measured on its code (docstrings
and comments left out): docs/architecture.md's generated table, and the limits
tests/test_architecture.py holds (issue 33: each new kind or lossy step lives in one folder)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mha_export"
# concept -> (what names it, the folder that is its home)
CONCEPTS = {
    "Multi-head Latent Attention": (re.compile(r"latent|\bmla\b|MLAConfig|MLAttention", re.I),
                                    "kinds/mla/"),
    # its homes: the lossy step, the quantized checkpoint formats --quantize source keeps, the
    # ExecuTorch target's int4 projections (torchao's 8da4w: the step as that target builds it)
    # and ONNX Runtime's MatMulNBits kernels probed (what ran: the step as that runtime runs it)
    "quantized projections": (re.compile(r"(?<![kv]_)quant(?!ile|_type)|MatMulNBits|nbits",
                                         re.I), ("lossy/", "weights/quantized/",
                                                 "targets/executorch/torchao.py",
                                                 "check/runners/ort_quantized.py")),
    "int8 cache": (re.compile(r"int8.cache|kv_cache_dtype|KVCache(Spec|Cost|Error)|kv_quant|"
                              r"calibrat|INT8_CACHE|INT8_CODES|given_codes|clip_rate|"
                              r"max_kv_error|int8_codes|read_cache|use_int8|[kv]_quant_type",
                              re.I), "lossy/"),
}
# (each kind's record names its quantizable projections and its refusals: the KV-shared kind
# added one module to each of the last two)
# (quantized projections: 13 since the runner rows name the MatMulNBits kernel that ran,
# check/runners/ort_kernels.py; 17 in 0.7 (issue 65), with no new branch on it: a target's
# record says which lossy steps it builds (ExecuTorch's names the step, in place of the step's
# table of targets), an export command's help moved from a docstring into its record (ONNX's
# --quantize example), bench's plan left the CLI (bench/plan.py reads --quantize, as the CLI
# still declares it), and ONNX Runtime's log reading left ort.py (ort_logs.py's compute ops);
# 18 and 13 since the QSA kind's record refused both steps (issue 66), 19 and 14 since
# DeepSeek-V4's did (issue 66); int8 cache: 12 since bench's plan left the CLI
# (BenchPlan.int8_cache))
LIMITS = {"Multi-head Latent Attention": 4, "quantized projections": 19, "int8 cache": 14}


def code_of(path: Path) -> str:
    """The module's code as ast.unparse writes it: no comments, no docstrings."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            body[0] = ast.Pass()
    return ast.unparse(tree)


# issue 65: outside the files whose path names it, an export target is named in at most three
# package files (targets/registry.py, the package's 0.6 alias, and one more: env.py's versions
# for ExecuTorch, TorchScript's deprecation note for AOTInductor)
TARGET_LIMIT = 3


def target_naming(target: str) -> list[str]:
    """The modules, outside the files whose path names ``target``, whose code names it."""
    pattern = re.compile(re.escape(target), re.I)
    return [rel for path in sorted(PACKAGE.rglob("*.py"))
            if target not in (rel := path.relative_to(PACKAGE).as_posix())
            and pattern.search(code_of(path))]


def naming(concept: str) -> list[str]:
    """The modules outside the concept's home whose code names it."""
    pattern, home = CONCEPTS[concept]
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if not rel.startswith(home) and pattern.search(code_of(path)):
            found.append(rel)
    return found


def _homes(concept: str) -> tuple[str, ...]:
    home = CONCEPTS[concept][1]
    return home if isinstance(home, tuple) else (home,)


def home_size(concept: str) -> tuple[int, int]:
    """(files, lines) of the concept's home folders (and files)."""
    files = [p for home in _homes(concept) for p in (
        [PACKAGE / home] if home.endswith(".py") else (PACKAGE / home).rglob("*.py"))]
    return len(files), sum(len(p.read_text().splitlines()) for p in files)


def structure_table() -> str:
    lines = ["| what | its home | modules outside it that name it | which |", "|---|---|---|---|"]
    for concept in CONCEPTS:
        outside = naming(concept)
        homes = ", ".join(f"`{h}`" for h in _homes(concept))
        lines.append(f"| {concept} | {homes} | {len(outside)} | "
                     + ", ".join(f"`{m}`" for m in outside) + " |")
    return "\n".join(lines)
