#!/usr/bin/env python3
"""Every link to a file in the repository's documentation and comments must
name a file that exists.

Checked:
  - Markdown links [text](target) in every tracked *.md file, relative to the
    file (a target with a scheme such as https: or mailto:, or a bare #anchor,
    is not a file; a #anchor after a path is dropped), and `path.md` code
    spans there;
  - paths ending in .md that source comments and scripts name (src/, include/,
    tools/, tests/, cmake/, scripts/, bench/, examples/, .ci/), relative to
    the repository root or to the file.

Usage: check_links.py ROOT            check the tree at ROOT
       check_links.py --self-test ROOT SCRATCH
           copies ROOT to SCRATCH, plants one broken Markdown link and one
           broken comment reference, and passes only if both are reported.
"""
import os
import re
import shutil
import subprocess
import sys

MD_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
MD_PATH = re.compile(r"(?<![\w/.-])((?:\.\./|\./)?[\w./-]*[\w-]\.md)\b")
CODE_DIRS = ("src", "include", "tools", "tests", "cmake", "scripts", "bench", "examples", ".ci")
CODE_EXT = (".h", ".cpp", ".hpp", ".cmake", ".txt", ".sh", ".py", ".in", "run")


def tracked_files(root):
    out = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True)
    if out.returncode == 0 and out.stdout.strip():
        return out.stdout.split()
    files = []
    for base, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in (".git", "build", ".venv") and not d.startswith("build")]
        files += [os.path.relpath(os.path.join(base, n), root) for n in names]
    return files


def exists(root, source, target):
    target = target.split("#", 1)[0]
    if not target:
        return True
    here = os.path.dirname(os.path.join(root, source))
    inside = os.path.realpath(root) + os.sep
    for base in (here, root):
        resolved = os.path.realpath(os.path.join(base, target))
        # Only the repository counts: a clone has nothing beside it.
        if resolved.startswith(inside) and os.path.exists(resolved):
            return True
    return False


def broken_links(root):
    broken = []
    for path in tracked_files(root):
        full = os.path.join(root, path)
        if not os.path.isfile(full):
            continue
        if path.endswith(".md"):
            in_fence = False
            for number, line in enumerate(open(full, encoding="utf-8", errors="replace"), 1):
                if line.lstrip().startswith("```"):
                    in_fence = not in_fence
                    continue
                if in_fence:
                    continue
                for target in MD_LINK.findall(line):
                    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
                        continue
                    if not exists(root, path, target):
                        broken.append(f"{path}:{number}: link to {target}, which does not exist")
                for target in re.findall(r"`([^`\s]+\.md)`", line):
                    if not exists(root, path, target):
                        broken.append(f"{path}:{number}: names {target}, which does not exist")
        elif path.split("/")[0] in CODE_DIRS and path.endswith(CODE_EXT):
            if path.startswith("tests/docs/"):
                continue  # this checker's own examples
            for number, line in enumerate(open(full, encoding="utf-8", errors="replace"), 1):
                for target in MD_PATH.findall(line):
                    if not exists(root, path, target):
                        broken.append(f"{path}:{number}: names {target}, which does not exist")
    return broken


def self_test(root, scratch):
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(root, scratch, ignore=shutil.ignore_patterns(".git", "build*", ".venv*"))
    with open(os.path.join(scratch, "docs", "planted.md"), "w") as f:
        f.write("See [the missing page](missing_page.md#part).\n")
    with open(os.path.join(scratch, "src", "planted.h"), "w") as f:
        f.write("// As docs/no_such_file.md explains.\n")
    found = broken_links(scratch)
    shutil.rmtree(scratch, ignore_errors=True)
    wanted = ("missing_page.md", "docs/no_such_file.md")
    missed = [w for w in wanted if not any(w in line for line in found)]
    if missed:
        print("self-test: the check did not report the planted " + ", ".join(missed), file=sys.stderr)
        return 1
    print("self-test: both planted broken links were reported")
    return 0


def main(argv):
    if len(argv) == 4 and argv[1] == "--self-test":
        return self_test(argv[2], argv[3])
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    broken = broken_links(argv[1])
    for line in broken:
        print(line, file=sys.stderr)
    if broken:
        print(f"{len(broken)} links name files that do not exist", file=sys.stderr)
        return 1
    print("every link names a file that exists")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
