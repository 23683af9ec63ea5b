"""The docs' runnable commands: fenced bash blocks marked `<!-- runnable ... -->` on the line before, which
tests run as written (kubectl commands on the real API server, helm commands in the chart's install test)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
BLOCK = re.compile(r"^<!-- runnable\b[^\n]*-->\n(?:[ \t]*\n)*```bash\n(.*?)^```", re.M | re.S)


def runnable_blocks(page: Path) -> list[str]:
    """The bodies of a page's runnable bash blocks."""
    return BLOCK.findall(page.read_text())


def runnable_commands(page: Path) -> list[list[str]]:
    """Each command of a page's runnable blocks as argv: continuation lines joined, `# comments` dropped."""
    commands = []
    for body in runnable_blocks(page):
        for line in body.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv:
                commands.append(argv)
    return commands


def docs_command(tool: str, verb: str) -> list[str]:
    """The one `tool verb ...` command the docs mark runnable, its arguments after the verb (a second one is
    an error)."""
    found = [argv[2:] for page in DOCS for argv in runnable_commands(page) if argv[:2] == [tool, verb]]
    if len(found) != 1:
        raise LookupError(f"the docs mark {len(found)} runnable `{tool} {verb}` commands, not one: {found}")
    return found[0]
