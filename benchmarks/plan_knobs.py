"""A plan's accepted template settings re-rendered by the current template library, some knobs set.

    python benchmarks/plan_knobs.py --plan examples/plans/llama-1b-h200/v5 --set '*_PDL=1' --out /tmp/pdl1
    python benchmarks/e2e_decode.py --device cuda --cases llama-1b:all@1/1024 --plan /tmp/pdl1/v3

An experiment on knobs, not a plan: it answers "what would this plan's step cost with knob X?" for a
knob the agents have not searched yet (on the H200: plan v3 with every ``*_PDL`` knob at 1, 1.213 ->
1.164 ms). Each accepted optimization must come from the template library: its ``description``
names the template (``op.strategy{KNOB=value,...}``) and its kernel file holds every knob's value as a
module constant, which is what is read back (descriptions are cut at 200 characters). Knobs the
template has gained since the plan was written take their defaults. ``--set PATTERN=VALUE`` (repeat)
sets every knob whose name matches the shell-style PATTERN, in every template that has it; the value
is a Python literal. The output is a copy of the version directory with ``kernels/composed.py``
re-rendered (the plan's CONFIG kept) and ``plan_knobs.json`` saying what was set; ``plan.json`` is
unchanged but for the re-rendered kernel's sha256, so ``e2e_decode.py`` and ``tkcc plan apply`` load it
as they load the plan (its files checked against their hashes).
Errors (no plan, a setting no template has, a value a knob does not allow, an optimization not from
the template library) are one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import hashlib
import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.templates import Choice, TemplateError, get_template, render_candidate  # noqa: E402
from compiler.plan import apply as plan_apply  # noqa: E402
from compiler.plan import artifact as plan_mod  # noqa: E402


class KnobError(ValueError):
    user_error = True


def parse_settings(items: list[str]) -> list[tuple[str, object]]:
    """``PATTERN=VALUE`` strings -> (pattern, value), the value a Python literal (a bare word: a string)."""
    out = []
    for item in items:
        pattern, sep, text = item.partition("=")
        if not sep or not pattern:
            raise KnobError(f"--set {item!r}: expected PATTERN=VALUE")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        out.append((pattern, value))
    return out


def accepted_choices(vdir: Path, plan) -> list[Choice]:
    """Each accepted optimization as the template choice it was rendered from (knobs read from its file)."""
    choices = []
    for o in plan.optimizations:
        try:
            t = get_template(o.description.split("{")[0])
        except TemplateError:
            raise KnobError(f"{o.name}: not rendered from the template library ({o.description[:60]!r})") from None
        src = (vdir / o.kernel).read_text()
        knobs = t.default()
        for k in t.knobs:
            m = re.search(rf"^{k.name} = (.+)$", src, re.M)
            if m:
                knobs[k.name] = ast.literal_eval(m.group(1))
        choices.append(Choice(t, knobs))
    return choices


def with_settings(choices: list[Choice], settings: list[tuple[str, object]]) -> tuple[list[Choice], dict]:
    """The choices with every matching knob set; {knob: value} of what was set. Raises on a pattern no
    knob matches or a value a knob does not allow."""
    done: dict[str, object] = {}
    out = []
    for c in choices:
        knobs = dict(c.knobs)
        for pattern, value in settings:
            for k in c.template.knobs:
                if fnmatch.fnmatchcase(k.name, pattern):
                    knobs[k.name] = value
                    done[k.name] = value
        problems = c.template.check(knobs)
        if problems:
            raise KnobError("; ".join(problems))
        out.append(Choice(c.template, knobs))
    missing = [p for p, _ in settings if not any(fnmatch.fnmatchcase(k, p) for k in done)]
    if missing:
        raise KnobError(f"no knob of the plan's templates matches {', '.join(missing)}")
    return out, done


def write_variant(plan_path: str, settings: list[tuple[str, object]], out: Path) -> Path:
    loaded = plan_apply.load(plan_path)
    vdir, plan = loaded.version_dir, loaded.plan
    choices, done = with_settings(accepted_choices(vdir, plan), settings)
    dest = out / vdir.name
    if dest.exists():
        raise KnobError(f"{dest} exists; pick another --out")
    source = render_candidate(choices, config=loaded.config or None,
                              description=f"{vdir} with {', '.join(f'{k}={v!r}' for k, v in done.items())}")
    tmp = out / f".{vdir.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(vdir, tmp)
    (tmp / "kernels" / plan_mod.COMPOSED_KERNEL).write_text(source)
    doc = json.loads((tmp / plan_mod.PLAN_FILE).read_text())   # the copy's own hash of the re-rendered kernel
    doc.setdefault("kernel_sha256", {})[f"kernels/{plan_mod.COMPOSED_KERNEL}"] = hashlib.sha256(
        source.encode()).hexdigest()
    (tmp / plan_mod.PLAN_FILE).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    (tmp / "plan_knobs.json").write_text(json.dumps({"plan": str(vdir), "set": done,
                                                     "choices": [c.key() for c in choices]}, indent=1) + "\n")
    tmp.rename(dest)                     # whole or not at all
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", required=True, help="plan directory (root or vN)")
    ap.add_argument("--set", action="append", default=[], metavar="PATTERN=VALUE", help="knob setting (repeat)")
    ap.add_argument("--out", required=True, help="directory to write the re-rendered version into")
    a = ap.parse_args(argv)
    try:
        dest = write_variant(a.plan, parse_settings(a.set), Path(a.out))
    except (KnobError, plan_mod.PlanError) as e:
        print(f"plan_knobs: {e}", file=sys.stderr)
        return 2
    print(json.loads((dest / "plan_knobs.json").read_text())["set"])
    print(f"wrote {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
