#!/usr/bin/python3
"""msprobe's own compare on the twin corpus, against TorchProbe's (issue 41, item 5). A development
script: CI has no msprobe, so its figures are committed (msprobe_compare_figures.json) and quoted in
docs/compare.md.

  1. Keep the C++ dumps and TorchProbe's reports of the corpus test:
       TORCHPROBE_TWINS_KEEP=/tmp/twins build/tests/torchprobe_tests -tc='*compares clean*'
  2. MSPROBE_PY=<msprobe checkout>/python /usr/bin/python3 msprobe_compare.py /tmp/twins

For every twin and level it runs msprobe.pytorch.compare.pt_compare (summary mode) with TorchProbe's
C++ dump as the NPU side and msprobe's Python dump as the bench, and counts the NPU rows that got a
bench row; then the same count in TorchProbe's compare_result CSV of the same pair.
"""
import csv
import glob
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def entry_of(row_name):
    """"Module.fc.Linear.forward.0.input.0" -> "Module.fc.Linear.forward.0"; "Aten.t.0.forward.input.0" ->
    "Aten.t.0.forward"."""
    parts = row_name.split(".")
    for i, p in enumerate(parts):
        if p in ("forward", "backward", "parameters_grad"):
            return ".".join(parts[:i + 2] if parts[0] in ("Module", "Cell") else parts[:i + 1])
    return row_name


def paired_entries(csv_path):
    """msprobe's CSV: the NPU entries, and those with at least one row paired with a bench row."""
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    entries = {entry_of(r["NPU Name"]) for r in rows}
    paired = {entry_of(r["NPU Name"]) for r in rows if r["Bench Name"] not in ("N/A", "")}
    return len(entries), len(paired)


def main():
    keep = sys.argv[1]
    sys.path[:0] = [os.path.join(HERE, "..", "msprobe_residual", "msprobe_shims"), os.environ["MSPROBE_PY"]]
    import torch113_compat  # noqa: F401
    from msprobe.pytorch.compare.pt_compare import pt_compare

    table, total = [], {"npu_entries": 0, "msprobe_paired": 0, "msprobe_fuzzy_paired": 0, "torchprobe_paired": 0,
                        "torchprobe_by_nature": 0}
    for twin in sorted(d for d in os.listdir(HERE) if os.path.isdir(os.path.join(HERE, d, "mix"))):
        for level in ("L1", "mix"):
            (npu,) = glob.glob(os.path.join(keep, twin, level, "dump", "step0", "*", "dump.json"))
            bench = os.path.join(HERE, twin, level, "dump.json")
            row = {"twin": twin, "level": level}
            for key, fuzzy in (("msprobe_paired", False), ("msprobe_fuzzy_paired", True)):
                out = tempfile.mkdtemp(prefix="msprobe_compare_")
                try:
                    pt_compare({"npu_path": npu, "bench_path": bench,
                                "stack_path": os.path.join(os.path.dirname(npu), "stack.json"),
                                "is_print_compare_log": False}, out, fuzzy_match=fuzzy)
                    (result,) = glob.glob(os.path.join(out, "compare_result_*.csv"))
                    row["npu_entries"], row[key] = paired_entries(result)
                except Exception as e:  # noqa: BLE001 -- msprobe's own failure is a figure too
                    row[key] = 0
                    row.setdefault("msprobe_failed", []).append(f"fuzzy_match={fuzzy}: {type(e).__name__}: {e}")
                    total["msprobe_failed_runs"] = total.get("msprobe_failed_runs", 0) + 1
            # TorchProbe's CSV keeps msprobe's columns and its exact-name rows; the pairs of the templates,
            # alignment and groups are in first_divergence.json: the NPU entries paired or in a group.
            with open(os.path.join(keep, twin, level, "out", "first_divergence.json")) as f:
                s = json.load(f)["summary"]
            row["torchprobe_paired"] = s["target_entries"] - s["target_only"] - s.get("target_only_by_nature", 0)
            row["torchprobe_by_nature"] = s.get("target_only_by_nature", 0)
            assert s["target_entries"] == row["npu_entries"], f"{twin}/{level}: entry counts differ"
            for k in ("npu_entries", "msprobe_paired", "msprobe_fuzzy_paired", "torchprobe_paired",
                      "torchprobe_by_nature"):
                total[k] += row[k]
            table.append(row)
    figures = {"description": "NPU side: TorchProbe's C++ dump; bench: msprobe's Python dump of the same twin. "
                              "Entries of the NPU side paired with a bench entry: msprobe's pt_compare (exact names; "
                              "fuzzy_match=True ignores call numbers) against TorchProbe's compare (names, "
                              "templates, alignment inside modules, groups); torchprobe_by_nature: NPU entries "
                              "TorchProbe lists as ones the C++ side has by nature.",
               "total": total, "twins": table}
    with open(os.path.join(HERE, "msprobe_compare_figures.json"), "w") as f:
        json.dump(figures, f, indent=1)
        f.write("\n")
    print(json.dumps(total))


if __name__ == "__main__":
    main()
