#!/usr/bin/env python3
"""Rebuild the JSON files of dump steps that were interrupted (a crash, SIGKILL, the OOM killer).

    python3 tools/recover_dump.py DUMP_PATH_OR_DIR [...]   # recover every interrupted step below
    python3 tools/recover_dump.py --check DIR              # only report what would be recovered

While a step runs, TorchProbe appends every entry it keeps to <rank dir>/journal.jsonl and removes
that journal once the step's dump.json (and debug.json) are complete. A journal that is still
there therefore marks an interrupted step; from it this tool writes, in that rank directory:

  dump.json       every entry the step had kept, in dump order (as TorchProbe would have written it)
  construct.json  the entries' parents (levels L0 and mix), when extra_info was on
  debug.json      save()'s entries, when there were any
  the task's own files (free_benchmark.csv, overflow_summary.json, ...) as the step last handed them over

`torchprobe recover` also writes ranks_digest.bin again (what `torchprobe ranks` reads of each
rank); this tool removes an outdated one instead, and `torchprobe ranks` reads dump.json there.

stack.json cannot be rebuilt (its call stacks were still raw addresses in the dead process): one
written by an earlier stop() of the step is left as it is. Files are written like TorchProbe's
(json.dump with indent=1, temporary file + rename, mode 0640), then the journal is removed unless
--keep-journal is given. Tensor files that were still queued when the process died are missing
from dump_tensor_data/; they are listed, and their entries (statistics included) are kept. Partial
tensor files left under temporary names (.NAME.pt.tmpPID.N) are removed, and so is a journal that was
still being created (.journal.jsonl.tmpPID.N: its step had recorded nothing). So are JSON files that
were being replaced (.dump.json.tmpPID.N and the like), and the rank's digest (.ranks_digest.bin.tmpPID.N),
beside the file they were to replace, in every directory below the given paths, journal or not;
--check lists them instead.

A step that ended (step() returned) has a last journal line {"end": true, "entries": K}; its
dump.json is rebuilt whole, byte for byte as TorchProbe writes it. A journal without that line is a
step the process died in: at most the last 4096 entry lines it had (io/journal.hpp, kMaxQueued)
were still waiting to be written and are lost. Such a step, one whose journal has fewer entry lines
than its last line counts, or one whose tensor files are missing is rebuilt from what is there and
marked incomplete: dump.json (and debug.json) get a top-level "torchprobe_recovery" beside msprobe's
keys, {"complete": false, "entries_recovered": N, "missing": "..."}, a line goes to the step's
dump_error_info.log, and the tool says so. A journal with its header and nothing else is a step
that was "lost": no dump.json is written for it (an empty one would read as a step that ran no op).

The same tool is in the command-line tool: `torchprobe recover DUMP [--check] [--keep-journal]`.

Only the Python standard library is used. Exit status: 0 when every journal was recovered whole
(or there was none), 3 when a step was recovered incomplete or was lost, 1 when a path is missing
or a journal could not be read (it wins over 3).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import tempfile
from pathlib import Path

JOURNAL = "journal.jsonl"
TEMP_TENSOR_RE = re.compile(r"^\..+\.tmp\d+\.\d+$")
TEMP_JOURNAL_GLOB = "." + JOURNAL + ".tmp*"  # a journal being created when the process died
# io::write_file_atomic's temporary for dump.json, stack.json, ...: "." + name + ".tmp" + pid + "." + n
TEMP_JSON_RE = re.compile(r"^\.(.+\.json|ranks_digest\.bin)\.tmp\d+\.\d+$")  # ... and ranks_digest.bin's
MAX_QUEUED = 4096  # io::Journal::kMaxQueued: lines not yet written when a step is interrupted, at most
ERROR_LOG = "dump_error_info.log"
INCOMPLETE = 3  # exit status: a step recovered incomplete, or lost


class Journal:
    def __init__(self, header, entries, task_files, trailer):
        self.header = header          # the first line, None for an empty file
        self.entries = entries        # entry lines, in file order
        self.task_files = task_files  # {"task_file": NAME, "text": CONTENT} lines, in file order
        self.trailer = trailer        # {"end": true, "entries": K} when it is the last line, else None

    def lines(self) -> int:
        """The lines the trailer counts."""
        return len(self.entries) + len(self.task_files)


def read_journal(path: Path) -> Journal:
    """A last line cut short by a crash or a full disk is skipped."""
    header = None
    entries = []
    task_files = []
    trailer = None
    with open(path, "rb") as f:
        raw_lines = f.read().split(b"\n")
    for number, raw in enumerate(raw_lines, start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            if number >= len(raw_lines) - 1:  # the last line: written in part when the process died
                print(f"{path}: ignoring the incomplete last line", file=sys.stderr)
                continue
            raise ValueError(f"{path}:{number}: not a JSON line")
        if header is None:
            if not is_header(obj):
                raise ValueError(f"{path}: not a TorchProbe journal (first line: {raw[:80]!r})")
            header = obj
        elif is_trailer(obj):
            trailer = obj
        elif is_task_file(obj):
            task_files.append(obj)
            trailer = None
        else:
            if not is_entry(obj):
                raise ValueError(f"{path}:{number}: not a journal entry (no file, name, order or body)")
            entries.append(obj)
            trailer = None  # the step went on after an earlier end (started again in the same directory)
    return Journal(header, entries, task_files, trailer)


def is_task_file(obj) -> bool:
    name = obj.get("task_file") if isinstance(obj, dict) else None
    return (isinstance(name, str) and name != "" and "/" not in name and not name.startswith(".")
            and isinstance(obj.get("text"), str))


def is_trailer(obj) -> bool:
    return isinstance(obj, dict) and obj.get("end") is True and isinstance(obj.get("entries"), int)


def is_header(obj) -> bool:
    return (isinstance(obj, dict) and obj.get("journal") == 1 and isinstance(obj.get("task"), str)
            and isinstance(obj.get("level"), str))


def is_entry(obj) -> bool:
    return (isinstance(obj, dict) and obj.get("file") in ("dump", "debug") and isinstance(obj.get("name"), str)
            and isinstance(obj.get("order"), int) and "body" in obj)


def assemble(entries, which: str):
    """{name: body} in dump order, and {name: parent}; a repeated name keeps its first place and takes the
    last body, as TorchProbe's writer does."""
    chosen = [e for e in entries if e.get("file") == which]
    # Stable: entries with the same order stay in the order they were written.
    chosen.sort(key=lambda e: e["order"])
    data, parents = {}, {}
    for e in chosen:
        if not e.get("construct_only", False):  # a name for construct.json only
            data[e["name"]] = e["body"]
        if "parent" in e:
            parents[e["name"]] = e["parent"]
    return data, parents


def write_json(path: Path, obj) -> None:
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1)
        os.chmod(tmp, 0o640 & ~current_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.chmod(tmp, 0o640 & ~current_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def top_level(header, level: str, data, missing=None):
    top = {
        "task": header["task"],
        "level": level,
        "framework": header.get("framework", "pytorch"),
        "dump_data_dir": header.get("dump_data_dir"),
        "data": data,
    }
    if missing:  # beside msprobe's keys: its compare reads only those
        top["torchprobe_recovery"] = {"complete": False, "entries_recovered": len(data), "missing": missing}
    return top


def log_error(rank_dir: Path, what: str, message: str) -> None:
    """An entry of the step's dump_error_info.log, in TorchProbe's (msprobe's classic) layout."""
    stamp = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %z")
    with open(rank_dir / ERROR_LOG, "a", encoding="utf-8") as f:
        f.write(f"[{stamp}] [ERROR] {what} failed: name={rank_dir}, pid={os.getpid()}\n{message}\n\n")


def missing_lines(journal: Journal) -> str:
    """What the journal lacks, or "" when it holds every line of a step that ended."""
    count = journal.lines()
    if journal.trailer is None:
        return (f"the step was interrupted: the entry lines after the {count} written "
                f"(at most {MAX_QUEUED}, still queued when the process stopped)")
    expected = journal.trailer["entries"]
    if count != expected:
        return f"{expected - count} of the step's {expected} journal lines (not written: see {ERROR_LOG})"
    return ""


def referenced_files(value, out):
    if isinstance(value, dict):
        name = value.get("data_name")
        if isinstance(name, str):
            out.append(name)
        for v in value.values():
            referenced_files(v, out)
    elif isinstance(value, list):
        for v in value:
            referenced_files(v, out)


def recover(rank_dir: Path, check_only: bool, keep_journal: bool):
    """Returns "complete", "incomplete", "lost" (the step is reported) or "error"."""
    journal_path = rank_dir / JOURNAL
    try:
        journal = read_journal(journal_path)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return "error"
    header, entries = journal.header, journal.entries
    if header is None:
        # TorchProbe renames a journal into place with its header, so an empty one was cut short by
        # something else (an older version, a full disk): nothing of the step was recorded in it.
        if not check_only and not keep_journal:
            journal_path.unlink()
        print(f"{rank_dir}: the journal is empty; nothing was recorded before the process stopped")
        return "complete"
    tensor_dir = rank_dir / "dump_tensor_data"
    if journal.lines() == 0 and journal.trailer is None:
        # The step began and the process stopped before any of its lines was written: what it had
        # recorded is unknown, so no dump.json says "nothing".
        message = ("lost: the step was interrupted before any entry line reached its journal "
                   f"(at most {MAX_QUEUED} were still queued); no dump.json is written for it")
        if not check_only:
            log_error(rank_dir, "recover_dump", f"torchprobe recover: {rank_dir}: {message}")
            if tensor_dir.is_dir():
                for leftover in tensor_dir.iterdir():
                    if TEMP_TENSOR_RE.match(leftover.name):
                        leftover.unlink()
            if not keep_journal:
                journal_path.unlink()
        print(f"{rank_dir}: {message}")
        return "lost"

    dump_data, parents = assemble(entries, "dump")
    debug_data, _ = assemble(entries, "debug")
    missing_files = []
    if tensor_dir.is_dir():
        names = []
        referenced_files(dump_data, names)
        referenced_files(debug_data, names)
        missing_files = sorted({n for n in names if not (tensor_dir / n).exists()})
    missing = [m for m in (missing_lines(journal),) if m]
    if missing_files:
        missing.append(f"{len(missing_files)} tensor files (still queued when the process stopped), "
                       f"e.g. {missing_files[0]}")
    missing_text = "; ".join(missing)

    written = []
    if not check_only:
        if header.get("writes_dump", True):
            write_json(rank_dir / "dump.json", top_level(header, header["level"], dump_data, missing_text))
            written.append("dump.json")
            # `torchprobe recover` writes ranks_digest.bin again from the journal; this tool does not,
            # so a digest of an earlier hand-over, which the new dump.json outdates, is removed:
            # `torchprobe ranks` then reads this step's dump.json files.
            if header.get("rank_digest", False):
                (rank_dir / "ranks_digest.bin").unlink(missing_ok=True)
            if header.get("extra_info", True):
                write_json(rank_dir / "construct.json", parents)
                written.append("construct.json")
        if debug_data:
            write_json(rank_dir / "debug.json", top_level(header, "debug", debug_data, missing_text))
            written.append("debug.json")
        task_files = {}
        for line in journal.task_files:
            task_files[line["task_file"]] = line["text"]  # the last hand-over's
        for name, text in task_files.items():
            write_text(rank_dir / name, text)
            written.append(name)
        if missing_text:
            log_error(rank_dir, "recover_dump",
                      f"torchprobe recover: {rank_dir}: incomplete: recovered {len(dump_data)} dump entries and "
                      f"{len(debug_data)} debug entries; missing: {missing_text}")
        if tensor_dir.is_dir():
            for leftover in tensor_dir.iterdir():
                if TEMP_TENSOR_RE.match(leftover.name):
                    leftover.unlink()
        if not keep_journal:
            journal_path.unlink()

    verb = "would recover" if check_only else "recovered"
    what = ", ".join(written) if written else "nothing written"
    print(f"{rank_dir}: {verb} {len(dump_data)} dump entries and {len(debug_data)} debug entries ({what})")
    if missing_text:
        print(f"{rank_dir}: incomplete: missing {missing_text}")
        return "incomplete"
    return "complete"


def clear_json_temporaries(root: Path, check_only: bool) -> None:
    """Removes (or, checking, lists) the temporary files of JSON files that were being replaced when the
    process died; the file they were to replace is still whole (or, without a journal, was never written)."""
    leftovers = sorted(p for p in root.rglob(".*.tmp*") if TEMP_JSON_RE.match(p.name) and p.is_file())
    for leftover in leftovers:
        what = "the rank's digest" if leftover.name.startswith(".ranks_digest.bin.") else "a JSON file"
        if check_only:
            print(f"{leftover}: would remove ({what} that was being replaced)")
        else:
            leftover.unlink()
            print(f"{leftover}: removed ({what} that was being replaced)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="a dump_path, step directory or rank directory")
    parser.add_argument("--check", action="store_true", help="report only; change nothing")
    parser.add_argument("--keep-journal", action="store_true", help="leave journal.jsonl in place")
    args = parser.parse_args(argv)
    ok = True
    incomplete = 0
    found = 0
    for root in args.paths:
        if not root.exists():
            print(f"error: {root} does not exist", file=sys.stderr)
            ok = False
            continue
        journals = [root / JOURNAL] if (root / JOURNAL).is_file() else sorted(root.rglob(JOURNAL))
        if not args.check:
            for leftover in root.rglob(TEMP_JOURNAL_GLOB):
                leftover.unlink()  # its step had recorded nothing yet
        clear_json_temporaries(root, args.check)
        for journal in journals:
            found += 1
            outcome = recover(journal.parent, args.check, args.keep_journal)
            ok = outcome != "error" and ok
            incomplete += outcome in ("incomplete", "lost")
    if found == 0:
        print("no interrupted step found (no journal.jsonl)")
    if incomplete:
        print(f"{incomplete} step(s) incomplete or lost (see above)", file=sys.stderr)
    return 1 if not ok else INCOMPLETE if incomplete else 0


if __name__ == "__main__":
    sys.exit(main())
