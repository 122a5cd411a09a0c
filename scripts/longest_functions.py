#!/usr/bin/env python3
"""The longest functions of troupe's library: every function or lambda-free body defined at
namespace or class scope in the C++ sources outside tests/, bench/ and examples/, by its lines
from the line that opens its body to the line that closes it. Tables (a body that is mostly one
initializer list of rows) count like any other function; say so beside a figure that has one.

Usage: scripts/longest_functions.py [--most N] [--over LINES]
Brace counting skips comments, strings and character literals; macros with bodies are counted
as functions (there are none this long)."""
import argparse
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SKIP = ("tests/", "bench/", "examples/", "build")
SIGNATURE = re.compile(r"\)\s*(const\s*)?(noexcept\s*)?(override\s*)?(final\s*)?(->[^{;]*)?"
                       r"(:[^;{]*)?\{\s*$")
CONTROL = re.compile(r"^\s*(if|for|while|switch|catch|else|do)\b")


def strip(text):
    """The source with comments, strings and character literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    lines = strip(path.read_text(errors="replace")).split("\n")
    depth, scopes, found = 0, [], []  # scopes: (depth, kind, start line, name)
    statement = ""
    for number, line in enumerate(lines, 1):
        for k, c in enumerate(line):
            if c == "{":
                head = (statement + line[:k + 1]).strip()
                inside = any(kind == "function" for _, kind, _, _ in scopes)
                if not inside and SIGNATURE.search(head) and not CONTROL.match(head):
                    name = re.findall(r"([~\w:]+)\s*\(", head)
                    scopes.append((depth, "function", number, name[0] if name else "?"))
                else:
                    scopes.append((depth, "block", number, ""))
                depth += 1
                statement = ""
            elif c == "}":
                depth -= 1
                if scopes:
                    _, kind, start, name = scopes.pop()
                    if kind == "function":
                        found.append((number - start + 1, name, start))
                statement = ""
            elif c == ";":
                statement = ""
        statement += line[line.rfind("}") + 1 if "}" in line else 0:] + " "
        if line.rstrip().endswith(";"):
            statement = ""
    return found


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--most", type=int, default=15)
    parser.add_argument("--over", type=int, default=0)
    args = parser.parse_args()
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                            "*.cc", "*.h", "*.cu", "*.inc"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    rows = []
    for name in files:
        if name.startswith(SKIP):
            continue
        for length, function, start in functions(ROOT / name):
            rows.append((length, f"{name}:{start}", function))
    rows.sort(reverse=True)
    shown = [r for r in rows if r[0] > args.over][:args.most]
    for length, where, function in shown:
        print(f"{length:5d}  {function}  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
