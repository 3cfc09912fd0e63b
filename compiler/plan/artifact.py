"""The plan artifact: what ``tkcc optimize`` leaves behind (DESIGN.md "Plan artifact").

A plan root directory (``--out DIR``) holds one sub-directory per version::

    DIR/v1/plan.json            model, hw, detected device, versions, traffic summary + hash,
                                optimizations, plan_speedup, parallelism, projected TPS, version
    DIR/v1/traffic_profile.json the full traffic profile (``tkcc recompile`` diffs new traffic against it)
    DIR/v1/kernels/<ops>_<sha>.py  each accepted candidate source, named by the ops it overrides and
                                the first 12 hex digits of its sha256 (``kernel_path``): one file per
                                distinct source, and a recompile re-verifying it writes the same name
    DIR/v1/kernels/composed.py  all accepted overrides in one candidate file (what ``plan apply`` loads)
    DIR/v1/kernels/bucket_b<lo>-<hi>.py  a variant serving decode batches lo..hi (``compiler.plan.buckets``)
    DIR/v1/report.md + plots/   the readable report

Plans are content-addressed: ``plan.json`` records the sha256 of every file under ``kernels/``
(``kernel_sha256``). ``verify_plan_files`` checks them (and that each kernel parses, without running
it); ``load`` calls it, so ``plan apply``, ``recompile``, the benchmarks and serving refuse a plan whose
kernel files were edited, removed or added after it was written (one line naming the file, exit 2)
and never import one.
    DIR/v2/...                  written by ``tkcc recompile`` beside the old one

Lineage is data, not part of a name: a version records ``parent_version``, and an optimization that
re-verified one of the parent's (a seed, authored ``seed:<name>``) keeps that name and records it as
``parent``, so names do not grow with each recompile.

A version directory is built under a temporary name and renamed into place in one ``os.rename``,
so a reader never sees a half-written plan (a crash leaves only a ``.tmp-*`` directory behind).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from persistent_engine import WorkloadPoint

SCHEMA = "tkcc.plan/1"
PLAN_FILE = "plan.json"
PROFILE_FILE = "traffic_profile.json"
COMPOSED_KERNEL = "composed.py"
_VERSION_DIR = re.compile(r"^v(\d+)$")


class PlanError(ValueError):
    """A plan directory that is missing or corrupt. The CLI prints it as one line, exit 2."""

    user_error = True


@dataclass(frozen=True)
class PointSpeedup:
    """A candidate's speedup at one workload point on each tier (None: not timed there). In plan.json and
    the run memory's board rows it is the point's map plus ``fast`` and ``slow``."""

    point: WorkloadPoint
    fast: float | None = None
    slow: float | None = None

    def to_dict(self) -> dict:
        return {**self.point.to_dict(), "fast": self.fast, "slow": self.slow}

    @classmethod
    def from_dict(cls, d: dict) -> "PointSpeedup":
        num = lambda v: None if v is None else float(v)  # noqa: E731
        return cls(WorkloadPoint.from_dict(d), num(d.get("fast")), num(d.get("slow")))


@dataclass(frozen=True)
class PlanOptimization:
    """One accepted candidate. ``speedup`` is reference time / candidate time on each tier (>1 is
    faster); ``per_point`` holds the same per workload point (the point's fields + ``fast``/``slow``)."""

    name: str
    targets: tuple[str, ...]
    speedup: dict[str, float]                       # {"fast": x, "slow": y}
    per_point: tuple[PointSpeedup, ...] = ()
    kernel: str = ""                                # path relative to the version dir
    author: str = ""
    description: str = ""
    noise: float = 0.0                              # fast-tier relative noise it had to beat
    projected: dict | None = None                   # a config: its replayed TTFT/TPOT/tokens/s (config_plan)
    parent: str = ""                                # the parent version's optimization it re-verified

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["projected"] is None:
            del d["projected"]
        d["targets"] = list(self.targets)
        d["per_point"] = [p.to_dict() for p in self.per_point]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "PlanOptimization":
        return cls(name=str(d["name"]), targets=tuple(str(t) for t in d["targets"]),
                   speedup={k: float(v) for k, v in d["speedup"].items() if v is not None},
                   per_point=tuple(PointSpeedup.from_dict(p) for p in d.get("per_point", ())),
                   kernel=str(d.get("kernel", "")), author=str(d.get("author", "")),
                   description=str(d.get("description", "")), noise=float(d.get("noise", 0.0)),
                   projected=dict(d["projected"]) if isinstance(d.get("projected"), dict) else None,
                   parent=str(d.get("parent", "")))


@dataclass(frozen=True)
class Plan:
    """plan.json as a typed record. Dict-valued fields are JSON data produced by other packages
    (traffic summary, parallelism layout, projections, baseline profile) and are stored verbatim."""

    model: str
    hw: str
    detected_device: dict
    software: dict
    traffic: dict                                   # {"source", "hash", "summary"}
    workload_points: tuple[WorkloadPoint, ...]     # stored as their maps
    optimizations: tuple[PlanOptimization, ...]
    plan_speedup: dict                              # {"fast": x, "slow": y, "per_point": [...]}
    parallelism: dict | None = None
    projected: dict | None = None
    tiers: dict = field(default_factory=dict)       # {"fast": {"layers": [...]}, "slow": {...}}
    baseline: dict = field(default_factory=dict)    # per-op time per point, per tier
    run: dict = field(default_factory=dict)         # budget, elapsed, interrupted, counts, board
    version: int = 0
    parent_version: int | None = None
    created_at: str = ""
    kernel_sha256: dict = field(default_factory=dict)   # "kernels/x.py" -> sha256 hex of its bytes
    variants: tuple = ()                            # per-bucket variants as their maps (compiler.plan.buckets)
    schema: str = SCHEMA

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "optimizations" and (k != "variants" or v)}
        d["optimizations"] = [o.to_dict() for o in self.optimizations]
        d["workload_points"] = [p.to_dict() for p in self.workload_points]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        return cls(model=d["model"], hw=d["hw"], detected_device=dict(d["detected_device"]),
                   software=dict(d["software"]), traffic=dict(d["traffic"]),
                   workload_points=tuple(WorkloadPoint.from_dict(p) for p in d["workload_points"]),
                   optimizations=tuple(PlanOptimization.from_dict(o) for o in d["optimizations"]),
                   plan_speedup=dict(d["plan_speedup"]), parallelism=d.get("parallelism"),
                   projected=d.get("projected"), tiers=dict(d.get("tiers") or {}),
                   baseline=dict(d.get("baseline") or {}), run=dict(d.get("run") or {}),
                   version=int(d["version"]), parent_version=d.get("parent_version"),
                   created_at=str(d.get("created_at", "")), kernel_sha256=dict(d.get("kernel_sha256") or {}),
                   variants=tuple(d.get("variants") or ()), schema=str(d.get("schema", SCHEMA)))

    def bucket_variants(self, where: str = "") -> tuple:
        """The variants as ``buckets.BucketVariant`` records, checked: well formed, disjoint ranges, members among
        the plan's optimizations (``PlanError``, one line, otherwise)."""
        from compiler.plan.buckets import BucketVariant, check_disjoint

        out = tuple(BucketVariant.from_dict(v, where) for v in self.variants)
        names = {o.name for o in self.optimizations}
        for v in out:
            if not set(v.members) <= names:
                raise PlanError(f"corrupt plan {where}: variant {v.lo}..{v.hi} names optimizations the plan does "
                                f"not hold: {', '.join(sorted(set(v.members) - names))}")
        check_disjoint(out, where)
        return out


# ---------------------------------------------------------------- validation
_REQUIRED = {"model": str, "hw": str, "detected_device": dict, "software": dict, "traffic": dict,
             "workload_points": list, "optimizations": list, "plan_speedup": dict, "version": int}


def validate(d: Any, where: str) -> list[str]:
    """Every problem with a plan.json document, as short phrases (empty when it is valid)."""
    if not isinstance(d, dict):
        return [f"{where} is not a JSON object"]
    problems = []
    if d.get("schema", SCHEMA) != SCHEMA:
        problems.append(f"unknown schema {d.get('schema')!r} (this tkcc reads {SCHEMA})")
    if not isinstance(d.get("variants", []), list):
        problems.append("field 'variants' should be list")
    for key, typ in _REQUIRED.items():
        if key not in d:
            problems.append(f"missing field {key!r}")
        elif not isinstance(d[key], typ) or (typ is int and isinstance(d[key], bool)):
            problems.append(f"field {key!r} should be {typ.__name__}")
    for i, o in enumerate(d.get("optimizations") or []):
        if not isinstance(o, dict):
            problems.append(f"optimizations[{i}] is not an object")
            continue
        if not isinstance(o.get("name"), str) or not o.get("name"):
            problems.append(f"optimizations[{i}] has no name")
        if not isinstance(o.get("targets"), list):
            problems.append(f"optimizations[{i}].targets should be a list")
        sp = o.get("speedup")
        if not isinstance(sp, dict) or not all(isinstance(sp.get(t), (int, float)) for t in ("fast", "slow")):
            problems.append(f"optimizations[{i}].speedup needs numbers for 'fast' and 'slow'")
    return problems


# ---------------------------------------------------------------- locating versions
def versions(root: str | os.PathLike) -> list[int]:
    """Version numbers present under a plan root, ascending."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = _VERSION_DIR.match(p.name)
        if m and (p / PLAN_FILE).is_file():
            out.append(int(m.group(1)))
    return sorted(out)


def resolve(path: str | os.PathLike) -> Path:
    """The version directory a user means: ``DIR`` itself when it holds plan.json, else the newest
    ``DIR/vN``. Raises PlanError with one line when there is none."""
    path = Path(path)
    if (path / PLAN_FILE).is_file():
        return path
    if not path.exists():
        raise PlanError(f"no plan at {path}: the directory does not exist")
    found = versions(path)
    if not found:
        raise PlanError(f"no plan at {path}: no plan.json and no v<N>/plan.json inside")
    return path / f"v{found[-1]}"


def seeds_of(plan: "Plan", vdir: str | os.PathLike) -> tuple[tuple[str, str], ...]:
    """(name, source) of each optimization of a plan version, to re-verify first in a new run."""
    return tuple((o.name, (Path(vdir) / o.kernel).read_text()) for o in plan.optimizations if o.kernel)


def root_of(version_dir: str | os.PathLike) -> Path:
    """The plan root that holds a version directory (the directory itself for an unversioned plan)."""
    version_dir = Path(version_dir)
    return version_dir.parent if _VERSION_DIR.match(version_dir.name) else version_dir


def sha256_file(path: str | os.PathLike) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def kernel_files(vdir: str | os.PathLike) -> list[str]:
    """Every file under ``vdir/kernels`` as a path relative to ``vdir`` (``kernels/x.py``), sorted."""
    kdir = Path(vdir) / "kernels"
    if not kdir.is_dir():
        return []
    return sorted(p.relative_to(vdir).as_posix() for p in kdir.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts)


def _read_doc(vdir: Path) -> dict:
    f = vdir / PLAN_FILE
    try:
        doc = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise PlanError(f"corrupt plan {f}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PlanError(f"cannot read plan {f}: {e}") from None
    return doc


def verify_plan_files(plan_dir: str | os.PathLike) -> tuple["Plan", Path]:
    """The plan at ``plan_dir`` (a root or a version directory) and its version directory, once every
    kernel file matches the sha256 that ``plan.json`` records for it and parses as Python (compiled,
    never executed). Raises ``PlanError`` with one line naming the first file that is missing, edited,
    unlisted or broken, or the plan.json problem. Apply, recompile and serving call this (through
    ``load``) before anything imports a kernel; cost: one read + sha256 per kernel file."""
    return load(plan_dir)


def _check_kernels(doc: dict, vdir: Path) -> None:
    recorded = doc.get("kernel_sha256")
    if not isinstance(recorded, dict):
        raise PlanError(f"plan {vdir} records no kernel hashes (kernel_sha256); it cannot be verified "
                        "and is refused (write it again with tkcc optimize)")
    present = kernel_files(vdir)
    for rel in sorted(recorded):
        path = vdir / rel
        if not isinstance(rel, str) or not rel.startswith("kernels/") or ".." in Path(rel).parts:
            raise PlanError(f"plan {vdir}: kernel_sha256 names {rel!r}, not a file under kernels/")
        if not path.is_file():
            raise PlanError(f"plan {vdir}: kernel file {rel} is missing")
        if sha256_file(path) != recorded[rel]:
            raise PlanError(f"plan {vdir}: kernel file {rel} does not match its sha256 in plan.json "
                            "(edited after the plan was written); refused")
    for rel in present:
        if rel not in recorded:
            raise PlanError(f"plan {vdir}: kernel file {rel} is not recorded in plan.json; refused")
    for rel in present:
        if rel.endswith(".py"):
            try:
                compile((vdir / rel).read_bytes(), str(vdir / rel), "exec", dont_inherit=True)
            except (SyntaxError, ValueError) as e:
                where = f"line {getattr(e, 'lineno', '?')}"
                raise PlanError(f"plan {vdir}: kernel file {rel} does not parse: "
                                f"{type(e).__name__}: {getattr(e, 'msg', e)} ({where})") from None


def load(path: str | os.PathLike) -> tuple[Plan, Path]:
    """Reads and validates a plan and verifies its kernel files (see ``verify_plan_files``); returns it
    with the version directory it came from."""
    vdir = resolve(path)
    f = vdir / PLAN_FILE
    doc = _read_doc(vdir)
    problems = validate(doc, str(f))
    for o in doc.get("optimizations") or [] if isinstance(doc, dict) else []:
        if isinstance(o, dict) and o.get("kernel") and not (vdir / o["kernel"]).is_file():
            problems.append(f"kernel file {o['kernel']} is missing")
    for v in doc.get("variants") or [] if isinstance(doc, dict) and isinstance(doc.get("variants"), list) else []:
        if isinstance(v, dict) and isinstance(v.get("kernel"), str) and not (vdir / v["kernel"]).is_file():
            problems.append(f"variant kernel file {v['kernel']} is missing")
    if problems:
        raise PlanError(f"corrupt plan {f}: {'; '.join(problems)}")
    _check_kernels(doc, vdir)
    plan = Plan.from_dict(doc)
    plan.bucket_variants(str(f))                   # well formed, disjoint, members of the plan (or PlanError)
    return plan, vdir


def load_profile(vdir: str | os.PathLike) -> dict:
    """The full traffic profile stored with a plan version."""
    f = Path(vdir) / PROFILE_FILE
    try:
        return json.loads(f.read_text())
    except FileNotFoundError:
        raise PlanError(f"plan {vdir} has no {PROFILE_FILE}; it cannot be diffed against new traffic") from None
    except (OSError, json.JSONDecodeError) as e:
        raise PlanError(f"corrupt plan file {f}: {e}") from None


# ---------------------------------------------------------------- writing
SEED_AUTHOR = "seed:"          # author of a candidate that re-verifies an optimization of a parent plan


def seed_author(name: str) -> str:
    """The author a seed (an optimization ``name`` of the parent version) is judged under."""
    return f"{SEED_AUTHOR}{name}"


def seed_parent(author: str) -> str:
    """The parent optimization's name when ``author`` is a seed's (``seed_author``), else ""."""
    return author[len(SEED_AUTHOR):] if author.startswith(SEED_AUTHOR) else ""


def _slug(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_").lower()
    return s[:40] or "config"


def kernel_path(source: str, targets: tuple[str, ...] = ()) -> str:
    """``kernels/<ops>_<sha12>.py`` for a candidate source: content-addressed, so one source has one
    name in every version (no copies under growing names) and two sources never share one."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    return f"kernels/{_slug('+'.join(targets))}_{digest}.py"


def write_version(root: str | os.PathLike, plan: Plan, *, sources: dict[str, str],
                  composed_source: str | None, profile: dict | None,
                  extra_files: Callable[[Plan], dict[str, bytes | str]] | None = None) -> Path:
    """Writes ``plan`` as the next version under ``root`` atomically and returns its directory.

    ``sources`` maps each optimization's ``kernel`` path (``kernels/x.py``) to its source;
    ``extra_files(plan)`` returns further files (relative path -> content: report.md, plots) for
    the plan as numbered. ``plan.version`` is replaced by the version actually allocated (one more
    than the newest present)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        while True:
            number = (versions(root) or [0])[-1] + 1
            numbered = dataclasses.replace(plan, version=number)
            doc = numbered.to_dict()
            files: dict[str, bytes | str] = {PLAN_FILE: json.dumps(doc, indent=2, sort_keys=True) + "\n"}
            if profile is not None:
                files[PROFILE_FILE] = json.dumps(profile, indent=2, sort_keys=True) + "\n"
            for rel, src in sources.items():
                files[rel] = src
            if composed_source is not None:
                files[f"kernels/{COMPOSED_KERNEL}"] = composed_source
            hashes = {rel: hashlib.sha256(c.encode() if isinstance(c, str) else c).hexdigest()
                      for rel, c in files.items() if rel.startswith("kernels/")}
            numbered = dataclasses.replace(numbered, kernel_sha256=hashes)
            files[PLAN_FILE] = json.dumps(numbered.to_dict(), indent=2, sort_keys=True) + "\n"
            if extra_files is not None:
                files.update(extra_files(numbered))
            for rel, content in files.items():
                target = tmp / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content.encode() if isinstance(content, str) else content)
            try:
                os.rename(tmp, root / f"v{number}")   # fails if another writer took this number
                return root / f"v{number}"
            except OSError:
                if not (root / f"v{number}").exists():
                    raise
                shutil.rmtree(tmp)
                tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Writes a file via a temp file in the same directory and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | os.PathLike, doc: Any, indent: int = 2) -> None:
    """``doc`` as indented JSON at ``path`` (a reader, or a kill, never sees half a file)."""
    atomic_write_text(path, json.dumps(doc, indent=indent) + "\n")
