#!/usr/bin/env python3
"""docs/clgrad.1 is `clgrad help --man` (SYNOPSIS and COMMANDS from the CLI's
option tables) with the checked-in ENVIRONMENT section kept (it comes from the
library's options table). Fails, with a diff, when the file is out of date.

usage: cli_man.py PATH/TO/clgrad PATH/TO/clgrad.1 [--update]
"""
import difflib
import re
import subprocess
import sys


def environment(text):
    """The ENVIRONMENT section (from its .SH line up to the next .SH), or ''."""
    m = re.search(r"^\.SH ENVIRONMENT\n.*?(?=^\.SH )", text, re.M | re.S)
    return m.group(0) if m else ""


def main():
    if len(sys.argv) not in (3, 4) or (len(sys.argv) == 4 and sys.argv[3] != "--update"):
        sys.exit(__doc__)
    clgrad, doc = sys.argv[1], sys.argv[2]
    gen = subprocess.run([clgrad, "help", "--man"], check=True, capture_output=True, text=True).stdout
    with open(doc, encoding="utf-8") as f:
        have = f.read()
    env = environment(gen)
    if not env:
        sys.exit("cli_man: `clgrad help --man` has no ENVIRONMENT section")
    kept = environment(have) or env
    want = gen.replace(env, kept, 1)
    if len(sys.argv) == 4:
        with open(doc, "w", encoding="utf-8") as f:
            f.write(want)
        print(f"cli_man: wrote {doc}")
        return
    if have != want:
        sys.stdout.writelines(difflib.unified_diff(have.splitlines(True), want.splitlines(True), doc, "clgrad help --man"))
        sys.exit(f"cli_man: {doc} is out of date; run: python3 tests/cli_man.py {clgrad} {doc} --update")
    print(f"cli_man: {doc} matches the option tables")


if __name__ == "__main__":
    main()
