"""examples/: small, no database files, every plan loads (kernel hashes verified) with names that did not
grow with its recompiles and content-addressed kernel files."""

import re
import subprocess
from pathlib import Path

from compiler.plan import artifact as plan_mod

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
MAX_BYTES = 3 * 1024 * 1024


def tracked(under: Path) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z", str(under)], cwd=ROOT, capture_output=True, check=True)
    return [ROOT / p for p in out.stdout.decode().split("\0") if p]


def test_examples_are_small_and_hold_no_database():
    files = tracked(EXAMPLES)
    assert files, "git ls-files found nothing under examples/"
    assert sum(f.stat().st_size for f in files if f.exists()) < MAX_BYTES
    assert not [f for f in files if re.search(r"\.db(-wal|-shm|-lock)?$", f.name)]


def test_every_example_plan_loads_with_content_addressed_kernels_and_short_names():
    roots = sorted(p for p in (EXAMPLES / "plans").iterdir() if p.is_dir())
    assert roots
    for root in roots:
        plan, vdir = plan_mod.load(root)                # raises on an edited, missing or unlisted kernel
        for o in plan.optimizations:
            assert o.kernel == plan_mod.kernel_path((vdir / o.kernel).read_text(), o.targets)
            assert not o.name.startswith(plan_mod.SEED_AUTHOR), o.name
            if o.parent:                                 # a re-verified seed keeps its parent's name
                assert o.name == o.parent and o.author == plan_mod.seed_author(o.parent)
