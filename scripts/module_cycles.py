#!/usr/bin/env python3
"""Import cycles between the top-level modules of Rust crates (layers must read top-down).

usage: scripts/module_cycles.py [--edges] [--docs] CRATE_SRC_DIR...

For each crate source directory (the folder holding lib.rs or main.rs) it walks the module tree
from the crate root along `mod name;` declarations, strips comments, string literals and
everything under `#[cfg(test)]`, and resolves every `crate::`, `super::` and `self::` path
(`use` trees with `{...}` groups included) to the top-level module it names. With `--docs`,
paths inside doc comments count too (rustdoc resolves them as links, so a lower module's docs
that link to a higher one name it just as an import does); plain `//` comments never count. A path from inside
top-level module A that lands in top-level module B is an edge A -> B. Any strongly connected set
of two or more modules is a cycle: it is printed with the edges that close it (one `file:line`
each) and the exit status is 1. `--edges` also prints every edge.
"""

import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_code(text, doc_paths):
    """Comments and string/char literals replaced by spaces; newlines kept for line numbers.
    With `doc_paths`, the `crate::`/`super::`/`self::` paths of doc comments are kept."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            comment = text[i:j]
            if doc_paths and re.match(r"//(/[^/]|/$|!)", comment):
                # A doc comment: its paths are intra-doc links, which rustdoc resolves, so they
                # count as references; the prose around them does not.
                line = [" "] * len(comment)
                for m in PATH.finditer(comment):
                    line[m.start() : m.end()] = m.group(0)
                out.append("".join(line))
            else:
                out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif re.match(r'b?r#*"', text[i:i + 260]) and (i == 0 or not re.match(r"\w", text[i - 1])):
            m = re.match(r'b?r(#*)"', text[i:])
            end = text.find('"' + m.group(1), i + m.end())
            j = n if end < 0 else end + 1 + len(m.group(1))
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'":
            # A char literal ('a', '\n', '\u{1F600}'), or else a lifetime / label ('a, 'static).
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:])
            if m:
                out.append(" " * m.end())
                i += m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def block_end(text, start):
    """Index just past the item beginning at `start`: its `;` or its balanced `{...}`."""
    depth = 0
    for j in range(start, len(text)):
        ch = text[j]
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == ";" and depth == 0:
            return j + 1
        elif ch == "{" and depth == 0:
            braces = 0
            for k in range(j, len(text)):
                if text[k] == "{":
                    braces += 1
                elif text[k] == "}":
                    braces -= 1
                    if braces == 0:
                        return k + 1
            return len(text)
    return len(text)


def blank(text, a, b):
    return text[:a] + re.sub(r"[^\n]", " ", text[a:b]) + text[b:]


CFG_TEST = re.compile(r"#\[cfg\(\s*test\s*\)\]")


def strip_test_items(text):
    """Blank out every item (a module, function, impl, use ...) marked `#[cfg(test)]`."""
    while True:
        m = CFG_TEST.search(text)
        if not m:
            return text
        # The item starts after any further attributes.
        j = m.end()
        while True:
            a = re.match(r"\s*#\[", text[j:])
            if not a:
                break
            j = block_end_bracket(text, j + a.end() - 1)
        text = blank(text, m.start(), block_end(text, j))


def block_end_bracket(text, open_idx):
    depth = 0
    for k in range(open_idx, len(text)):
        if text[k] == "[":
            depth += 1
        elif text[k] == "]":
            depth -= 1
            if depth == 0:
                return k + 1
    return len(text)


def split_use_tree(tree):
    """`a::{b, c::{d, e}}` -> [['a','b'], ['a','c','d'], ['a','c','e']] (aliases and globs dropped)."""
    tree = re.sub(r"\s+", "", tree)
    paths = []

    def walk(s, prefix):
        # Split s at top-level commas.
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        parts.append(cur)
        for part in parts:
            if not part:
                continue
            brace = part.find("{")
            if brace >= 0 and part.endswith("}"):
                head = [seg for seg in part[:brace].split("::") if seg]
                walk(part[brace + 1 : -1], prefix + head)
            else:
                segs = [seg for seg in part.split("as")[0].split("::") if seg]
                if part.endswith("*"):
                    segs = segs[:-1] if segs and segs[-1] == "*" else segs
                paths.append(prefix + segs)

    walk(tree, [])
    return paths


USE = re.compile(r"\buse\s+((?:crate|super|self)\b[^;]*);")
PATH = re.compile(r"\b(crate|super|self)((?:\s*::\s*" + IDENT + r")+)")


def resolve(segs, modpath):
    """Absolute top-level module named by a path written inside `modpath`, or None."""
    cur = list(modpath)
    i = 0
    if segs and segs[0] == "crate":
        cur, i = [], 1
    else:
        while i < len(segs) and segs[i] in ("super", "self"):
            if segs[i] == "super":
                if not cur:
                    return None
                cur.pop()
            i += 1
    if cur:
        return cur[0]
    return segs[i] if i < len(segs) else None


def module_files(src, doc_paths):
    """(file, module path) for every non-test module file reachable from the crate root."""
    for root_name in ("lib.rs", "main.rs"):
        root = os.path.join(src, root_name)
        if os.path.exists(root):
            break
    else:
        sys.exit(f"{src}: no lib.rs or main.rs")
    todo, seen = [(root, [], os.path.dirname(root))], []
    while todo:
        path, modpath, child_dir = todo.pop()
        seen.append((path, modpath))
        text = strip_test_items(strip_code(open(path, encoding="utf-8").read(), doc_paths))
        for m in re.finditer(r"((?:#\[[^\]]*\]\s*)*)(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", text):
            attrs, name = m.group(1), m.group(2)
            explicit = re.search(r'#\[path\s*=', attrs)
            if explicit:
                raise SystemExit(f"{path}: #[path] on `mod {name}` is not supported")
            for cand in (os.path.join(child_dir, name + ".rs"), os.path.join(child_dir, name, "mod.rs")):
                if os.path.exists(cand):
                    sub_dir = os.path.join(child_dir, name)
                    todo.append((cand, modpath + [name], sub_dir))
                    break
            else:
                raise SystemExit(f"{path}: no file for `mod {name};`")
    return seen


INLINE_MOD = re.compile(r"\bmod\s+(" + IDENT + r")\s*\{")


def paths_in(text, modpath):
    """(offset, module path the path is written in, its segments) for each path in `text`;
    inline `mod name { ... }` blocks are read one level down."""
    found = []
    pos = 0
    while True:
        m = INLINE_MOD.search(text, pos)
        if not m:
            break
        end = block_end(text, m.end() - 1)
        inner = paths_in(text[m.end() : end - 1], modpath + [m.group(1)])
        found += [(m.end() + off, mp, segs) for off, mp, segs in inner]
        text = blank(text, m.end(), end - 1)
        pos = end
    for m in USE.finditer(text):
        for segs in split_use_tree(m.group(1)):
            found.append((m.start(), modpath, segs))
        text = blank(text, m.start(), m.end())
    for m in PATH.finditer(text):
        segs = [m.group(1)] + [s.strip() for s in m.group(2).split("::") if s.strip()]
        found.append((m.start(), modpath, segs))
    return found


def crate_edges(src, doc_paths=False):
    """(top-level modules, {(a, b): 'file:line'}) for the crate at `src`: one entry, with the
    first place it is written, for each edge between two of its top-level modules."""
    files = module_files(src, doc_paths)
    texts = {
        path: strip_test_items(strip_code(open(path, encoding="utf-8").read(), doc_paths))
        for path, _ in files
    }
    tops = {mp[0] for _, mp in files if mp}
    root = files[0][0]
    tops |= {m.group(1) for m in INLINE_MOD.finditer(texts[root])}
    edges = {}
    for path, modpath in files:
        text = texts[path]
        for pos, written_in, segs in paths_in(text, modpath):
            if not written_in:
                continue
            target = resolve(segs, written_in)
            if target in tops and target != written_in[0]:
                line = text.count("\n", 0, pos) + 1
                edges.setdefault((written_in[0], target), f"{os.path.relpath(path)}:{line}")
    return tops, edges


def cycles(nodes, edges):
    """Strongly connected components of two or more nodes (Tarjan), each sorted."""
    succ = {v: sorted(b for a, b in edges if a == v) for v in nodes}
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def main(argv):
    show_edges = "--edges" in argv
    doc_paths = "--docs" in argv
    dirs = [a for a in argv if a not in ("--edges", "--docs")]
    if not dirs:
        sys.exit(__doc__)
    failed = False
    for src in dirs:
        nodes, edges = crate_edges(src, doc_paths)
        if show_edges:
            for (a, b), where in sorted(edges.items()):
                print(f"{src}: {a} -> {b}  ({where})")
        found = cycles(nodes, edges)
        for comp in found:
            failed = True
            print(f"{src}: import cycle between {', '.join(comp)}:")
            for (a, b), where in sorted(edges.items()):
                if a in comp and b in comp:
                    print(f"    {a} -> {b}  ({where})")
        if not found:
            print(f"{src}: no import cycles between its {len(nodes)} top-level modules")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
