"""The backend seam holds: the core (src/core/) and the binding (python/src/) never ask which
backend runs, never carry a backend's code (CUDA kernels, streams), and never include a backend's
headers; each backend describes itself (backend_traits, src/core/backend.hpp) and owns its code
generation under its own folder. Adding a backend is then the files docs/architecture.md lists.

Reads the sources only (no build, no import of gpupool's extension), so it also runs as a plain
script: ``python3 python/tests/test_layers.py``.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

#: Folders whose code must not know which backend it runs on.
LAYERS = ("src/core", "python/src")
#: Source files there.
SUFFIXES = {".cpp", ".hpp", ".h", ".cc", ".inl"}

#: What only a backend may say: a name for one backend, CUDA kernel code, CUDA's stream type, a
#: backend's header, a CUDA header, a compile-time switch on the backend.
FORBIDDEN = {
    # backend_kind::cuda, backend_kind::cpu, and any backend added later
    "a backend by name (backend_kind::...)": re.compile(r"\bbackend_kind::\w+"),
    "__global__": re.compile(r"__global__"),
    "blockIdx": re.compile(r"\bblockIdx\b"),
    "cudaStream": re.compile(r"\bcudaStream"),
    "a backend's header": re.compile(r'#\s*include\s*[<"](?:src/)?(?:cuda|cpu)/'),
    "a CUDA header": re.compile(r"#\s*include\s*<(?:cuda|nvrtc|cub/|thrust/)"),
    "#if on the backend": re.compile(r"#\s*(?:el)?if.*\bGPUPOOL_(?:HAS|WITH)_CUDA\b"),
}

#: (file, what, reason): mentions that stay, each with why. Keep this short.
ALLOWED = {
    (
        "src/core/backend_select.cpp",
        "a backend by name (backend_kind::...)",
        "the public gpupool::cuda_availability() asks about the CUDA backend by name",
    ),
}


def _without_comments(text):
    """The text with // and /* */ comments blanked (line numbers kept): prose may name CUDA."""
    out = []
    i, n = 0, len(text)
    in_string = None
    while i < n:
        c = text[i]
        if in_string:
            out.append(c)
            if c == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 2
                continue
            if c == in_string:
                in_string = None
            i += 1
        elif c == '"' or (c == "'" and not (i > 0 and text[i - 1].isalnum())):
            # (a ' after a digit or a letter is a digit separator, not a character literal)
            in_string = c
            out.append(c)
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def seam_violations(root=ROOT):
    """Every forbidden mention in the layers, as "file:line: what: text" strings."""
    allowed = {(f, what) for f, what, _ in ALLOWED}
    found = []
    for layer in LAYERS:
        for path in sorted((root / layer).rglob("*")):
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            rel = path.relative_to(root).as_posix()
            code = _without_comments(path.read_text(encoding="utf-8", errors="replace"))
            for number, line in enumerate(code.splitlines(), 1):
                for what, pattern in FORBIDDEN.items():
                    if pattern.search(line) and (rel, what) not in allowed:
                        found.append(f"{rel}:{number}: {what}: {line.strip()}")
    return found


#: Code outside the library that uses only its public headers (include/gpupool/).
PUBLIC_ONLY = ("python/src", "tools", "bench", "examples")
PRIVATE_INCLUDE = re.compile(r'#\s*include\s*[<"](?:src/)?(?:core|cpu|cuda)/')


def private_includes(root=ROOT):
    """Includes of the library's private headers from code that should use the public ones."""
    found = []
    for folder in PUBLIC_ONLY:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in SUFFIXES | {".cu"} or not path.is_file():
                continue
            code = _without_comments(path.read_text(encoding="utf-8", errors="replace"))
            for number, line in enumerate(code.splitlines(), 1):
                if PRIVATE_INCLUDE.search(line):
                    found.append(f"{path.relative_to(root).as_posix()}:{number}: {line.strip()}")
    return found


def unused_allowances(root=ROOT):
    """Allow-list entries that no longer match anything (they would hide a future mention)."""
    stale = []
    for rel, what, _ in ALLOWED:
        path = root / rel
        code = _without_comments(path.read_text(encoding="utf-8")) if path.is_file() else ""
        if not FORBIDDEN[what].search(code):
            stale.append(f"{rel}: {what}")
    return stale


def registration_gaps(root=ROOT):
    """Backends the library lists in one place but not in another: every registration backend.hpp
    declares is in backend_select.cpp's table, and each is defined under its own folder src/<name>/
    with traits of its own."""
    gaps = []
    header = (root / "src/core/backend.hpp").read_text(encoding="utf-8")
    table = (root / "src/core/backend_select.cpp").read_text(encoding="utf-8")
    declared = re.findall(r"extern const backend_registration (\w+)_backend_registration;", header)
    if not declared:
        gaps.append("src/core/backend.hpp declares no backend registration")
    for name in declared:
        if f"&{name}_backend_registration" not in table:
            gaps.append(f"{name}: declared in backend.hpp, missing from backend_select.cpp's table")
        folder = root / "src" / name
        definition = re.compile(rf"backend_registration {name}_backend_registration\s*\{{([^}}]*)\}}")
        defined = []
        for path in sorted(folder.rglob("*.cpp")) if folder.is_dir() else []:
            match = definition.search(path.read_text(encoding="utf-8"))
            if match:
                defined.append(path)
                if "traits" not in match.group(1):
                    gaps.append(f"{path.relative_to(root)}: the registration names no traits")
        if not defined:
            gaps.append(f"{name}: no src/{name}/*.cpp defines {name}_backend_registration")
    return gaps


def test_the_core_and_the_binding_never_ask_which_backend_runs():
    found = seam_violations()
    assert not found, "backend-specific code outside src/<backend>/:\n" + "\n".join(found)


def test_the_binding_tools_and_benchmarks_use_only_public_headers():
    found = private_includes()
    assert not found, "private headers included outside the library:\n" + "\n".join(found)


def test_every_allowance_is_still_needed():
    assert not unused_allowances(), unused_allowances()


def test_every_backend_is_registered_in_the_places_the_architecture_lists():
    assert not registration_gaps(), registration_gaps()


if __name__ == "__main__":
    problems = (seam_violations() + private_includes() + unused_allowances() +
                registration_gaps())
    for p in problems:
        print(p)
    sys.exit(1 if problems else 0)
