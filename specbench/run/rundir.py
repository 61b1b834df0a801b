"""A run directory: what a benchmark run writes, guarded so results are never lost or mixed.

Layout: `config.json` (the fingerprint: the config minus the keys a resumption may change),
`config.yaml`, `samples.jsonl` (append-only, one line per finished sample), `forward_costs.json`,
`summary.json` (derived from the samples), `.lock`.

- One writer at a time: an exclusive `flock` on `.lock`, held until the run ends (the kernel drops
  it when the process dies); a second run is refused naming the holder's pid.
- Open only after the whole configuration was validated and the model loaded; nothing is created
  on disk before. The path must be new, empty, or hold a run (`check_run_dir`,
  specbench/config/identity.py with the fingerprint and `config_hash`): a directory of
  anything else (a model, a project) is refused before anything is written into it.
- Identity: the fingerprint holds the config and the run's provenance (the weights' and trained
  artifacts' hashes, specbench/run/provenance.py); a resumption against anything else is refused in
  one line naming what differs. The default run name carries `config_hash` (`${fingerprint:}` in
  conf/config.yaml), so different settings never share a default directory.
- `overwrite=true` deletes nothing: the old contents move to `<run>.old-<timestamp>` (the report
  skips such dirs).
- The fingerprint is written before the first sample, so a later run with another configuration
  is refused even when no sample was written yet.
- Damage is a one-line error naming the file and the way out, never a silently skipped check:
  samples without a readable `config.json`, a sample line that is not a record, an unreadable
  `forward_costs.json`, a directory that cannot be written. A last line cut short by a crash is
  the one repair done silently (that sample runs again).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from specbench.config.identity import LOCK, check_run_dir, fingerprint, io_error, refuse_lean, refuse_other_config
from specbench.core.errors import Interrupted, SpecBenchError
from specbench.run.provenance import describe_change

OLD_MARK = ".old-"
# what _move_aside names a run's old contents: <run>.old-YYYYmmdd-HHMMSS, -N when that was taken
MOVED_ASIDE = re.compile(r".+\.old-\d{8}-\d{6}(-\d+)?")
RECOVER = "pass overwrite=true (moves the old contents aside, deletes nothing) or choose another run_name"

# run dirs this process holds the lock of: path -> open lock file (a crashed run() in this
# process may not have released it; the same process may take its own lock again)
_HELD: dict[Path, object] = {}


def _same_training(old: dict, new: dict) -> bool:
    """`train` differs only in a way that cannot matter: the old run recorded it before it left the
    identity of methods that train nothing, or neither run loaded a trained artifact (the
    artifacts themselves are compared by hash in `provenance`)."""
    no_artifacts = not (old.get("provenance") or {}).get("artifacts") and not (new.get("provenance") or {}).get("artifacts")
    return "train" not in new or no_artifacts


def moved_aside(path) -> bool:
    """Where `overwrite=true` moved a run's old contents (not a run named e.g. my.old-baseline)."""
    return MOVED_ASIDE.fullmatch(Path(path).name) is not None


def check_same_samples(path, samples, overwrite: bool) -> None:
    """Refuse, before the model is loaded, a resumption whose task data changed in place (a JSONL file
    rewritten, another data dir): a finished sample recorded from another prompt or reference under
    the same id would be mixed with the new ones. Records written before `sample_digest` pass."""
    p = Path(str(path)).expanduser() / "samples.jsonl"
    if overwrite or not p.is_file():
        return
    now = {s.id: s.digest() for s in samples}
    for line in p.read_bytes().splitlines():
        rec = _record(line) or {}  # damaged lines: RunDir.done says so
        was = rec.get("sample_digest")
        if was is not None and rec["id"] in now and now[rec["id"]] != was:
            raise SpecBenchError(
                f"run dir {p.parent} holds sample {rec['id']!r} made from another prompt or reference than the task "
                "gives it now (its data changed since); choose another run_name or pass overwrite=true")


def read_config(path: Path, missing: str, damaged_suffix: str = "") -> dict:
    """A run dir's config.json (its fingerprint) as a dict; one-line errors when it is missing or
    damaged (`damaged_suffix` says what that means for the caller)."""
    cfg_path = Path(path) / "config.json"
    try:
        config = json.loads(cfg_path.read_text())
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
    except FileNotFoundError:
        raise SpecBenchError(missing) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise SpecBenchError(f"{cfg_path} is damaged ({e})" + (f", {damaged_suffix}" if damaged_suffix else "")) from None
    return config


def lock_holder(path: Path) -> int | None:
    """The pid of the process writing run dir `path`, or None if no run holds it."""
    lock = Path(path) / LOCK
    if not lock.exists() or Path(path).resolve() in _HELD:
        return None
    try:
        with open(lock, "r") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return _pid(f)
            fcntl.flock(f, fcntl.LOCK_UN)
    except OSError:
        return None
    return None


def _pid(f) -> int | str:
    f.seek(0)
    text = f.read().strip()
    return int(text) if text.isdigit() else "unknown"


class RunDir:
    def __init__(self, path: Path, cfg: DictConfig, overwrite: bool = False, provenance: dict | None = None):
        """`provenance`: the weights' and trained artifacts' identity (specbench.run.provenance), kept
        in the fingerprint."""
        self.path = check_run_dir(path)
        self.samples_path = self.path / "samples.jsonl"
        self._fresh_summary = False
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock()
            fp = fingerprint(cfg)
            if provenance is not None:
                fp["provenance"] = provenance
            if overwrite and self._has_results():
                self._move_aside()
            else:
                refuse_lean(self.path)
                self._check_same_config(fp)
                self.done()  # damaged sample lines are refused before anything runs
                self._drop_derived()
            (self.path / "config.json").write_text(json.dumps(fp, indent=2, sort_keys=True))
            (self.path / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        except OSError as e:
            self.release()
            raise io_error(self.path, e) from None
        except SpecBenchError:
            self.release()
            raise

    # -- the lock ---------------------------------------------------------------------------
    def _lock(self) -> None:
        key = self.path.resolve()
        if key in _HELD:
            return
        f = open(self.path / LOCK, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _pid(f)
            f.close()
            raise SpecBenchError(
                f"run dir {self.path} is in use by another run (pid {pid}); wait for it or choose another run_name"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        _HELD[key] = f

    def release(self) -> None:
        f = _HELD.pop(self.path.resolve(), None)
        if f is not None:
            f.close()  # closing drops the flock

    # -- validation of what is there --------------------------------------------------------
    def _has_results(self) -> bool:
        return any(p.name not in (LOCK, "config.json", "config.yaml") for p in self.path.iterdir())

    def _check_same_config(self, fp: dict) -> None:
        has_samples = self.samples_path.exists() and self.samples_path.stat().st_size > 0
        if not has_samples:
            return  # nothing to mix with: this run's fingerprint replaces any other
        old = read_config(self.path, f"run dir {self.path} holds samples but no config.json, so they cannot be checked against "
                                     f"this configuration; {RECOVER}",
                          f"so the samples beside it cannot be checked; {RECOVER}")
        refuse_other_config(self.path, old, fp, {"provenance"} | ({"train"} if _same_training(old, fp) else set()))
        if "provenance" in fp and (change := describe_change(old.get("provenance"), fp["provenance"])):
            raise SpecBenchError(
                f"run dir {self.path} holds results made with other weights or inputs: {change}; "
                "choose another run_name or pass overwrite=true"
            )

    def _drop_derived(self) -> None:
        """No samples yet: this run's fingerprint replaces any other, so what an earlier configuration
        derived here (its T(k) profile, a summary) goes too, or a later resumption would report it."""
        if self.samples_path.exists() and self.samples_path.stat().st_size > 0:
            return
        for name in ("forward_costs.json", "profile.json", "summary.json"):
            (self.path / name).unlink(missing_ok=True)

    def _move_aside(self) -> None:
        """Every entry but the lock moves to a sibling `<run>.old-<timestamp>` (nothing deleted)."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        old = self.path.with_name(f"{self.path.name}{OLD_MARK}{stamp}")
        n = 1
        while old.exists():
            old = self.path.with_name(f"{self.path.name}{OLD_MARK}{stamp}-{n}")
            n += 1
        old.mkdir()
        for p in self.path.iterdir():
            if p.name != LOCK:
                p.rename(old / p.name)
        print(f"overwrite=true: the previous contents of {self.path} moved to {old}")

    # -- samples ----------------------------------------------------------------------------
    def done(self) -> dict[str, dict]:
        out: dict[str, dict] = {}
        if not self.samples_path.exists():
            return out
        data = self.samples_path.read_bytes()
        if data and not data.endswith(b"\n"):
            # a line cut short by a crash: drop it (that sample runs again) so the file stays valid JSONL
            with open(self.samples_path, "r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)
            data = data[: data.rfind(b"\n") + 1]
        lines: dict[str, int] = {}
        for i, line in enumerate(data.splitlines(), 1):
            rec = _record(line)
            if rec is None:
                raise SpecBenchError(f"{self.samples_path}:{i} is not a sample record; the file is damaged: {RECOVER}")
            if rec["id"] in lines:  # two records of one sample: which one counts is unknowable
                raise SpecBenchError(f"{self.samples_path}:{i} holds sample {rec['id']!r} again (first at line "
                                     f"{lines[rec['id']]}): the run is mixed; {RECOVER}")
            lines[rec["id"]], out[rec["id"]] = i, rec
        return out

    def interrupted(self, unit: str) -> Interrupted:
        """The one line for Ctrl-C during a run: what this directory keeps, how to go on."""
        return Interrupted(f"{len(self.done())} {unit} kept in {self.path}; run the same command to resume")

    def append(self, rec: dict) -> None:
        try:
            if not self._fresh_summary:
                # the summary describes the samples before this one: stale from now on
                (self.path / "summary.json").unlink(missing_ok=True)
                self._fresh_summary = True
            with open(self.samples_path, "a") as f:
                f.write(json.dumps(rec) + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise io_error(self.path, e) from None

    def write(self, name: str, text: str) -> None:
        """Whole or not at all (an interrupt mid-write leaves the old file or none, never half)."""
        tmp = self.path / f".{name}.part"
        try:
            tmp.write_text(text)
            os.replace(tmp, self.path / name)
        except OSError as e:
            raise io_error(self.path, e) from None

    def read_profile(self) -> dict | None:
        """profile.json (the profile's spread, re-measured points): shown, never computed with,
        so a missing or damaged file is simply absent."""
        try:
            prof = json.loads((self.path / "profile.json").read_text())
        except (OSError, ValueError, UnicodeDecodeError):
            return None
        return prof if isinstance(prof, dict) else None

    def read_costs(self) -> dict[int, float] | None:
        p = self.path / "forward_costs.json"
        if not p.exists():
            return None
        try:
            costs = {int(k): float(v) for k, v in json.loads(p.read_text()).items()}
            if not costs or any(v <= 0 for v in costs.values()):
                raise ValueError("no positive costs")
        except (ValueError, TypeError, AttributeError, UnicodeDecodeError) as e:
            raise SpecBenchError(
                f"{p} is damaged ({type(e).__name__}); delete it (the run then has no predicted speedup) "
                "or re-run with overwrite=true"
            ) from None
        return costs


def _record(line: bytes | dict) -> dict | None:
    """A sample line as written by the runner (or an entry of a summary's per_sample), or None."""
    try:
        rec = line if isinstance(line, dict) else json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("id"), str) or not isinstance(rec.get("method"), dict):
        return None
    if not isinstance(rec.get("ar"), dict):
        return None
    return rec


def read_finished(path: Path, summary: dict) -> tuple[dict, list[dict]]:
    """The fingerprint and sample records of a finished run dir, for the report; a run still
    being written, damaged, or mixed (its files disagree) is refused with one line."""
    path = Path(path)
    pid = lock_holder(path)
    if pid is not None:
        raise SpecBenchError(f"run dir {path} is still being written (pid {pid}); wait for it to finish")
    config = read_config(path, f"run dir {path} has no config.json: cannot tell what produced its results")
    samples = path / "samples.jsonl"
    lean = not samples.exists() and isinstance(summary.get("per_sample"), list)  # a copy kept as config + summary
    records, seen = [], set()
    for i, line in enumerate(summary["per_sample"] if lean else samples.read_bytes().splitlines() if samples.exists() else [], 1):
        rec = _record(line)
        if rec is None:
            raise SpecBenchError(f"{samples}:{i} is not a sample record: refusing a damaged run")
        if rec["id"] in seen:
            raise SpecBenchError(f"{samples} holds sample {rec['id']!r} twice (two runs wrote into one dir): refusing a mixed run")
        seen.add(rec["id"])
        records.append(rec)
    n = summary.get("samples")
    if not isinstance(n, int) or n > len(records) or (lean and n != len(records)):
        raise SpecBenchError(f"{path}/summary.json counts {n!r} samples but {'per_sample' if lean else 'samples.jsonl'} holds {len(records)}: refusing a mixed or damaged run")
    if n < len(records):  # resumed with a smaller task.num_samples: the summary counts a subset, per_sample says which
        by_id = {r["id"]: r for r in records}
        ids = [p.get("id") for p in summary.get("per_sample") or [] if isinstance(p, dict)]
        if len(ids) != n or any(i not in by_id for i in ids):
            raise SpecBenchError(f"{path}/summary.json counts {n} of the {len(records)} samples in samples.jsonl and does not "
                                 "say which: refusing a mixed or damaged run")
        records = [by_id[i] for i in ids]
    meta = summary.get("meta") or {}
    for key in ("method", "model", "task"):
        if key in meta and meta[key] != (config.get(key) or {}).get("name"):
            raise SpecBenchError(
                f"{path}: summary.json says {key} {meta[key]!r}, config.json {(config.get(key) or {}).get('name')!r}: refusing a mixed run"
            )
    return config, records
