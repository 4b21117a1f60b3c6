#!/usr/bin/env python3
"""Checks the shape of src/ and crates/core/src/: no import cycle among
the files (modules) of any folder, no file over 700 lines before its tests,
no function over 100 lines, and a pure planning core. The core is its own
crate, which the compiler keeps from importing the agent and from any
client, runtime or network library (none is its dependency); this checks
what a dependency list cannot: no async, no file, process or environment
access, no clock read. Prints each breach and exits 1 when there is one."""

import os
import re
import sys

MAX_FILE_LINES = 700
MAX_FN_LINES = 100
# I/O written inline, in any file of the core.
IO_WORDS = re.compile(
    r"\basync\b|\.await\b|\btokio::|\bkube::(?:Api|Client|api::Api)\b|\bkube::runtime\b"
    r"|\breqwest::|\bstd::fs\b|\bstd::process\b|\bstd::net\b|\bstd::env\b|\bgit2::|\bhyper|\boctocrab::"
    r"|\bTimestamp::now\(|\bSystemTime::now\(|\bInstant::now\(|\bZoned::now\(|\bUNIX_EPOCH\.elapsed\("
    r"|\bstd::thread\b|\bstd::os\b|\bstd::io::std(?:in|out|err)\b|\bblock_on\b|\bprintln!|\beprintln!"
    r"|\.read_dir\(|\.exists\(\)|\.is_file\(\)|\.is_dir\(\)|\.metadata\(\)"
)
# I/O brought in by a `use` (braces expanded): what each path may not start with.
IO_PATHS = (
    "tokio", "reqwest", "git2", "hyper", "hyper_util", "octocrab", "kube::runtime", "kube::Api", "kube::Client",
    "kube::api::Api", "std::fs", "std::process", "std::net", "std::env", "std::thread", "std::os",
)
REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
# Each crate's source root, and whether every module of it is pure.
CRATES = [(os.path.join(REPO, "src"), False), (os.path.join(REPO, "crates", "core", "src"), True)]
# The core's shared types import no stage (planning, sync, rollout, ...):
# only what a manifest is.
MODEL, MODEL_MAY_IMPORT = "model", {"model", "manifest"}


def module_of(path, src):
    parts = os.path.relpath(path, src)[:-3].split(os.sep)
    return tuple(parts[:-1] if parts[-1] in ("mod", "lib", "main") else parts)


def code_before_tests(text):
    cut = text.find("#[cfg(test)]\nmod tests")
    return text if cut < 0 else text[:cut]


def sources(src):
    for folder, _, names in os.walk(src):
        for name in sorted(names):
            if name.endswith(".rs") and name != "tests.rs":
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    yield path, code_before_tests(f.read())


def resolve(current, segments, modules):
    head, rest = segments[0], segments[1:]
    if head == "crate":
        base = []
    elif head == "super":
        base, rest = list(current), segments
        while rest and rest[0] == "super":
            base, rest = base[:-1], rest[1:]
    elif head == "self":
        base = list(current)
    else:
        return None
    full = base + rest
    for k in range(len(full), 0, -1):
        if tuple(full[:k]) in modules:
            return tuple(full[:k])
    # An item named at the crate root may be a re-export: it is from the
    # module it comes from.
    if full:
        return modules.root_item(full[0])
    return None


def split_top(text):
    """The comma-separated parts of `text`, braces kept whole."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def expand(tree):
    """`a::{b, c::{d, self}}` as the paths it names: a::b, a::c::d, a::c."""
    tree = re.sub(r"\s+", "", tree)
    i = tree.find("{")
    if i < 0:
        yield tree
        return
    prefix = tree[:i]
    for part in split_top(tree[i + 1 : tree.rfind("}")]):
        for rest in expand(part):
            yield prefix.rstrip(":") if rest == "self" else prefix + rest


def use_paths(code):
    """Every path a `use` names, braces expanded, `as` renames dropped."""
    for m in re.finditer(r"\buse\s+([^;]+);", code):
        for path in expand(re.sub(r"\s+as\s+\w+", "", m.group(1))):
            yield path


def imports(path, code, modules, src):
    current = module_of(path, src)
    code = re.sub(r"//[^\n]*", "", code)
    found = set()
    for m in re.finditer(r"\b((?:crate|super|self)(?:::\w+)+)", code):
        found.add(resolve(current, m.group(1).split("::"), modules))
    for used in use_paths(code):
        segments = used.split("::")
        if segments[0] in ("crate", "super", "self"):
            found.add(resolve(current, segments, modules))
    found.discard(None)
    found.discard(current)
    return found


def cycles(edges):
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def is_io_path(path):
    if path in ("crate::blocking", "kube::*", "kube::api::*"):
        return True
    return any(path == io or path.startswith(io + "::") for io in IO_PATHS)


def impure(files):
    for path, code in sorted(files.items()):
        shown = os.path.relpath(path, REPO)
        code = re.sub(r"//[^\n]*", "", code)
        words = set(IO_WORDS.findall(code))
        words.update(p for p in use_paths(code) if is_io_path(p))
        if words:
            yield f"{shown}: in the pure core, but does I/O ({', '.join(sorted(words))})"


def long_functions(code):
    lines = code.split("\n")
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)(?:pub(?:\([^)]*\))? )?(?:async )?(?:const )?fn (\w+)", line)
        if not m:
            continue
        for j in range(i + 1, len(lines)):
            if lines[j] == m.group(1) + "}":
                if j - i + 1 > MAX_FN_LINES:
                    yield m.group(2), j - i + 1
                break


class Modules(set):
    """A crate's modules, and the names its root brings in with a `use`
    (re-exported or not: the root's children reach them as `crate::X`):
    name -> module, with `*` for what a glob brings."""

    def __init__(self, files, src):
        super().__init__(module_of(p, src) for p in files)
        self.reexports = {}
        self.defined = set()
        for path, code in files.items():
            if module_of(path, src) != ():
                continue
            code = re.sub(r"//[^\n]*", "", code)
            self.defined.update(re.findall(r"\b(?:const|static|fn|struct|enum|type|trait|union)\s+(\w+)", code))
            for m in re.finditer(r"\buse\s+([^;]+);", code):
                for used in expand(re.sub(r"\s+as\s+", "@", m.group(1))):
                    *prefix, last = used.split("::")
                    original, name = (last.split("@") + [last])[:2] if "@" in last else (last, last)
                    path_ = [s for s in prefix + [original] if s not in ("crate", "self")]
                    for k in range(len(path_), 0, -1):
                        if tuple(path_[:k]) in self:
                            self.reexports.setdefault(name, tuple(path_[:k]))
                            break

    def root_item(self, name):
        """The module a name used at the crate root comes from, if known:
        none for the root's own items."""
        if name in self.defined:
            return None
        return self.reexports.get(name, self.reexports.get("*"))


def breaches_of(src, pure):
    files = dict(sources(src))
    modules = Modules(files, src)
    # Between siblings: a file's imports of (anything inside) another file of
    # its folder, counting the imports of its own submodules.
    sibling_edges = {}
    for path, code in files.items():
        current = module_of(path, src)
        for target in imports(path, code, modules, src):
            for depth in range(len(current)):
                folder = current[:depth]
                if target[:depth] == folder and len(target) > depth and target[depth] != current[depth]:
                    sibling_edges.setdefault(current[: depth + 1], set()).add(target[: depth + 1])
    for component in cycles(sibling_edges):
        yield f"import cycle in {os.path.relpath(src, REPO)}: " + " <-> ".join("/".join(m) or "src" for m in component)
    if pure:
        yield from impure(files)
        yield from model_breaches(files, modules, src)
    for path, code in sorted(files.items()):
        shown = os.path.relpath(path, REPO)
        count = code.count("\n")
        if count > MAX_FILE_LINES:
            yield f"{shown}: {count} lines before its tests (at most {MAX_FILE_LINES})"
        for name, length in long_functions(code):
            yield f"{shown}: fn {name} is {length} lines (at most {MAX_FN_LINES})"


def model_breaches(files, modules, src):
    for path, code in sorted(files.items()):
        if module_of(path, src)[:1] != (MODEL,):
            continue
        for target in sorted(imports(path, code, modules, src)):
            if target and target[0] not in MODEL_MAY_IMPORT:
                shown = os.path.relpath(path, REPO)
                yield f"{shown}: the shared types import {'::'.join(target)} (only {', '.join(sorted(MODEL_MAY_IMPORT))})"


def main():
    breaches = [breach for src, pure in CRATES for breach in breaches_of(src, pure)]
    for breach in breaches:
        print(breach)
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main())
