"""Source edits shared by the subset-build scripts (build_flash_attn.sh, build_block_sparse_attn.sh):
both libraries are FlashAttention-2 code with the same static_switch.h macros and a setup.py that
lists its kernel files. Each edit first checks that the text it replaces is the one it knows, and
stops with a message naming the file otherwise. Run by the scripts (stdlib only), not imported by
attnbench."""

from __future__ import annotations

import re
import sys
from pathlib import Path

MARK = "attnbench subset build"


class Sources:
    """A source tree being cut down; `script` and `known` name the script and the layout it knows
    (for messages); the C++ errors say "This {library} build ..." and "... a full {package} build"."""

    def __init__(self, root, script: str, known: str, library: str, package: str):
        self.root, self.script, self.known = Path(root), script, known
        self.library, self.package = library, package

    def fail(self, path: Path, why: str):
        sys.exit(
            f"{self.script}: error: {path.relative_to(self.root)} does not look as expected: {why}. "
            f"This script knows the layout of {self.known}; another version needs the script "
            "updated (or a full build)."
        )

    def read(self, name: str) -> tuple[Path, str]:
        path = self.root / name
        if not path.is_file():
            self.fail(path, "file missing")
        text = path.read_text()
        if MARK in text:
            self.fail(path, "already patched")
        return path, text

    def read_setup(self, needed, name: str = "setup.py") -> tuple[Path, str]:
        """The setup script `name`, after checking that it holds each of the `needed` snippets."""
        path, text = self.read(name)
        for snippet in needed:
            if snippet not in text:
                self.fail(path, f"{snippet} not found")
        return path, text

    def setup_keeping(self, needed, api_cpp: str, kernels, all_kernels) -> tuple[Path, str, list]:
        """setup.py checked for the `needed` snippets, its CUDA source list (`api_cpp`, then
        exactly `all_kernels`) cut to `api_cpp` and `kernels`; also the sources kept."""
        path, text = self.read_setup(needed)
        kept = [api_cpp, *kernels]
        return path, self.cut_source_list(path, text, api_cpp, all_kernels, kept), kept

    def replace_once(self, path, text: str, old: str, new: str) -> str:
        if text.count(old) != 1:
            self.fail(path, f"{text.count(old)} occurrences of {old.strip()!r}, expected 1")
        return text.replace(old, new)

    def macro_block(self, path, text: str, name: str):
        """The `#define name(...)` block, up to the line closing its lambda call."""
        found = list(
            re.finditer(rf"^[ \t]*#define {name}\(.*?^\s*\}}\(\)[ \t]*$", text, re.M | re.S)
        )
        if len(found) != 1:
            self.fail(path, f"{len(found)} definitions of {name} found, expected 1")
        return found[0]

    def cut_switches(self, name: str, all_head_dims, head_dims, note: str, extra: str = ""):
        """static_switch.h: HEADDIM_SWITCH dispatches exactly `head_dims` (an error otherwise),
        FP16_SWITCH bf16 only (an error for fp16); `extra` is appended (more macros)."""
        path, text = self.read(name)
        lib, full = self.library, self.package
        headdim = self.macro_block(path, text, "HEADDIM_SWITCH")
        body = headdim.group(0)
        bounds = [int(n) for n in re.findall(r"HEADDIM <= (\d+)", body)]
        kernels = [int(n) for n in re.findall(r"kHeadDim = (\d+);", body)]
        if (
            bounds != all_head_dims
            or kernels != all_head_dims
            or body.count("return __VA_ARGS__();") != len(all_head_dims)
        ):
            self.fail(
                path,
                f"HEADDIM_SWITCH dispatches to {kernels} (bounds {bounds}), expected {all_head_dims}",
            )
        dims = ", ".join(map(str, head_dims))
        opener = ["if"] + ["} else if"] * (len(head_dims) - 1)
        branches = "".join(
            f"    {keyword} (HEADDIM == {d}) {{ \\\n"
            f"      constexpr static int kHeadDim = {d}; \\\n"
            f"      return __VA_ARGS__(); \\\n"
            for keyword, d in zip(opener, head_dims)
        )
        new_headdim = (
            f"// {MARK} ({self.script}): kernels for head dims {dims} only. {note}\n"
            "#define HEADDIM_SWITCH(HEADDIM, ...) \\\n"
            "  [&] { \\\n"
            f"{branches}"
            "    } else { \\\n"
            f'      TORCH_CHECK(false, "This {lib} build has kernels for head dims {dims} only, got ", \\\n'
            f'                  HEADDIM, "; other head dims need a full {full} build."); \\\n'
            "    } \\\n"
            "  }()"
        )
        fp16 = self.macro_block(path, text, "FP16_SWITCH")
        body = fp16.group(0)
        if (
            re.findall(r"cutlass::\w+", body) != ["cutlass::half_t", "cutlass::bfloat16_t"]
            or "if (COND)" not in body
            or body.count("return __VA_ARGS__();") != 2
        ):
            self.fail(path, "FP16_SWITCH is not `if (COND) half_t else bfloat16_t`")
        new_fp16 = (
            f"// {MARK} ({self.script}): bf16 kernels only.\n"
            "#define FP16_SWITCH(COND, ...) \\\n"
            "  [&] { \\\n"
            f'    TORCH_CHECK(!(COND), "This {lib} build has bf16 kernels only, got fp16; " \\\n'
            f'                "fp16 needs a full {full} build."); \\\n'
            "    using elem_type = cutlass::bfloat16_t; \\\n"
            "    return __VA_ARGS__(); \\\n"
            "  }()"
        )
        # Replace the later block first so the earlier one's offsets stay valid.
        for match, new in sorted(
            [(headdim, new_headdim), (fp16, new_fp16)], key=lambda p: -p[0].start()
        ):
            text = text[: match.start()] + new + text[match.end() :]
        path.write_text(text + extra)

    def cut_source_list(self, path, text: str, first: str, expected, kept) -> str:
        """setup.py's CUDA source list (the one starting with `first`), which must hold exactly
        `expected` after it, becomes `kept` (first included)."""
        lists = list(
            re.finditer(
                rf'^(?P<indent>[ \t]*)sources=\[\s*\n\s*"{re.escape(first)}",\n(?P<kernels>.*?)\n\s*\],',
                text,
                re.M | re.S,
            )
        )
        if len(lists) != 1:
            self.fail(
                path, f"{len(lists)} CUDA source lists starting with {Path(first).name}, expected 1"
            )
        listed = re.findall(r'^\s*"([^"]+)",\s*$', lists[0].group("kernels"), re.M)
        if sorted(listed) != sorted(expected):
            self.fail(
                path,
                f"the CUDA sources differ from the known {len(expected)} kernel files: unknown "
                f"{sorted(set(listed) - set(expected))}, missing {sorted(set(expected) - set(listed))}",
            )
        for name in kept:
            if not (self.root / name).is_file():
                self.fail(path, f"source {name} is listed but not in the source")
        indent = lists[0].group("indent")
        new_list = (
            f"{indent}# {MARK}: bf16, the chosen head dims only\n{indent}sources=[\n"
            + "".join(f'{indent}    "{name}",\n' for name in kept)
            + f"{indent}],"
        )
        return text[: lists[0].start()] + new_list + text[lists[0].end() :]
