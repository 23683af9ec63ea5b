"""README.md and docs/ cannot point nowhere: every relative link names a file that exists and every #anchor a
heading (by GitHub's slug rules) or an explicit anchor of the page it points into."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import doc_blocks

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(
    r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)"
)
# Pictures another change commits; a link to one of them is a placeholder until then, any other missing file a
# fault.
PENDING: set[str] = set()
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup and link targets dropped, lower case, punctuation removed
    (letters, digits, spaces, hyphens and underscores kept), each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays, its target goes
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor a page has: its headings' slugs (a repeated one numbered -1, -2, ... as GitHub does) and
    explicit `<a id=...>` / `name=` anchors."""
    text = FENCE.sub("", page.read_text())
    found: set[str] = set()
    seen: dict[str, int] = {}
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        found.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    found |= set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))
    return found


def links(page: Path) -> list[str]:
    """Every link target in a page outside code blocks and code spans."""
    text = FENCE.sub("", page.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)
    return [m.group(1) or m.group(2) for m in LINK.finditer(text)]


def test_the_slug_rules_match_githubs():
    assert slug("Autoscaling, judged in Dynamo's replay") == "autoscaling-judged-in-dynamos-replay"
    assert (
        slug("The TPOT-aware route (`localPrefillMaxTpotFraction`), conversation trace")
        == "the-tpot-aware-route-localprefillmaxtpotfraction-conversation-trace"
    )
    assert slug("`tandem top`") == "tandem-top"
    assert (
        slug("Goodput (CPU): conditional, disaggregated and colocated")
        == "goodput-cpu-conditional-disaggregated-and-colocated"
    )
    assert slug("See [the reference](docs/x.md) now") == "see-the-reference-now"


def test_the_checker_finds_a_broken_link_and_a_broken_anchor(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# Top\n\n## Top\n\n[ok](#top-1) [gone](missing.md) [bad](#nowhere)\n\n```\n[code](skip.md)\n```\n"
    )
    assert anchors(page) == {"top", "top-1"}
    assert links(page) == ["#top-1", "missing.md", "#nowhere"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path):
    broken = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ... are not ours to resolve
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() and str(dest.relative_to(ROOT)) not in PENDING:
            broken.append(
                f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}"
            )
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading or anchor #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


def test_the_readme_reaches_the_local_run_the_kubernetes_install_and_the_crd_reference_in_one_click():
    targets = set(links(ROOT / "README.md"))
    assert {"docs/getting-started.md", "docs/kubernetes.md", "docs/inferenceservice.md"} <= {
        t.split("#")[0] for t in targets
    }
    assert {p.name for p in (ROOT / "docs").glob("*.md")} <= {Path(t.split("#")[0]).name for t in targets}, (
        "a docs page the README does not link"
    )


def test_runnable_blocks_hold_only_commands_the_tests_run():
    """A bash block marked `<!-- runnable -->` is run by the k8s tests as written: its kubectl commands by
    tests/k8s/test_names_beside_upstream.py on the real API server, its `helm install` and `helm test` by
    tests/k8s/test_helm_install.py. Anything else in one would be a claim no test runs."""
    commands = {str(p.relative_to(ROOT)): doc_blocks.runnable_commands(p) for p in doc_blocks.DOCS}
    assert [argv[0] for argv in commands["docs/kubernetes.md"]].count("kubectl") >= 4
    for page, argvs in commands.items():
        for argv in argvs:
            assert argv[0] == "kubectl" or argv[:2] in (["helm", "install"], ["helm", "test"]), (page, argv)
    assert doc_blocks.docs_command("helm", "install")[:2] == ["tandem", "charts/tandem"]
    assert doc_blocks.docs_command("helm", "test")[0] == "tandem"


def test_the_runnable_marker_is_read(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "<!-- runnable -->\n\n```bash\nkubectl get tsvc  # note\nhelm test x \\\n  -n y\n```\n\n"
        "```bash\nkubectl delete everything\n```\n"
    )
    assert doc_blocks.runnable_commands(page) == [
        ["kubectl", "get", "tsvc"],
        ["helm", "test", "x", "-n", "y"],
    ]
