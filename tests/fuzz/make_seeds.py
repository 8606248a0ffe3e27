#!/usr/bin/env python3
"""Makes the seed inputs of each fuzz target (tests/fuzz/corpus/TARGET/seed-*) from real files:
msprobe's reference dumps (tests/data/reference-dumps) and the suite's data (tests/data). Run once
when a target is added; the corpus libFuzzer grows from the seeds is kept minimized beside them
(tests/fuzz/README.md). Inputs standing for several files hold them apart with NUL bytes."""
import glob
import hashlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
REF = os.path.join(REPO, "tests", "data", "reference-dumps")
DATA = os.path.join(REPO, "tests", "data")
MOST = 64 * 1024  # a seed larger than this slows fuzzing more than it helps


def read(path):
    with open(path, "rb") as f:
        return f.read()


def put(target, data):
    if len(data) > MOST:
        return
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + hashlib.sha1(data).hexdigest()[:16]), "wb") as f:
        f.write(data)


def files(*patterns):
    out = []
    for p in patterns:
        out += glob.glob(p, recursive=True)
    return sorted(set(out))


def digest_payload(dump_json, missing=""):
    """A ranks_digest.bin payload (io/rank_digest.hpp) for a dump.json: its kept entries, each tensor
    with a made-up hash (any 64 bits serve a fuzzer), no non-finite tensor, the recovery note."""
    import json
    import struct
    data = json.loads(dump_json, parse_constant=float)["data"]
    strings, ids = [], {}

    def sid(text):
        if text not in ids:
            ids[text] = len(strings)
            strings.append(text)
        return ids[text]

    def tensors(value, site, out):
        if isinstance(value, dict) and "shape" in value and ("Max" in value or "md5" in value):
            out.append((site, value))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                tensors(v, site + "." + str(i), out)
        elif isinstance(value, dict):
            for k, v in value.items():
                tensors(v, site + "." + k, out)

    entries = b""
    kept = 0
    for name, body in data.items():
        if not (name.startswith("Distributed.") or ".parameters_grad." in name or "parameters" in body):
            continue
        items = []
        for section in ("input_args", "input_kwargs", "output", "parameters"):
            if section in body and (name.startswith("Distributed.") or section == "parameters"):
                tensors(body[section], section, items)
        if ".parameters_grad." in name:
            for k, v in body.items():
                tensors(v, k, items)
        entries += struct.pack("<II", sid(name), len(items))
        for site, item in items:
            shape = json.dumps(item["shape"], separators=(",", ":"))
            digest = int(hashlib.sha1(json.dumps(item, sort_keys=True).encode()).hexdigest()[:16], 16)
            entries += struct.pack("<IIQ", sid(site), sid(shape), digest)
        kept += 1
    note = sid(missing) if missing else 0xFFFFFFFF
    table = struct.pack("<I", len(strings)) + b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in strings)
    return table + struct.pack("<QI", len(data), kept) + entries + b"\0" + struct.pack("<I", note)


def digest_file(payload):
    import struct
    import zlib
    packed = zlib.compress(payload, 1)
    return b"TPRD" + struct.pack("<IIII", 1, len(payload), len(packed), zlib.crc32(payload)) + packed


def main():
    for dump in files(REF + "/**/dump.json", DATA + "/msprobe*/**/dump.json", DATA + "/golden/**/dump.json"):
        d = os.path.dirname(dump)
        parts = [read(dump)]
        for side in ("stack.json", "construct.json"):
            p = os.path.join(d, side)
            parts.append(read(p) if os.path.exists(p) else b"")
        put("dump_json", b"\0".join(parts))
        put("run_ut_inputs", parts[0])
    for step in files(DATA + "/ranks/step*", REF + "/*/step*"):
        ranks = files(step + "/rank*/dump.json")
        if ranks:
            put("ranks", b"\0".join(read(r) for r in ranks))
            for i, r in enumerate(ranks):
                payload = digest_payload(read(r), "the step was interrupted" if i == 1 else "")
                put("rank_digest", b"\1" + payload)
                put("rank_digest", b"\0" + digest_file(payload))
    for j in files(DATA + "/recover/**/journal.jsonl"):
        put("journal", read(j))
    for n in files(REF + "/grad_probe/**/*.npy"):
        put("npy", read(n))
    manifest = b'{"format": 1, "run_id": "20261201T000000Z-1-0abc", "grad_level": "L1"}\n' \
               b'{"step": 0, "params": ["fc.weight", "fc.bias"]}\n'
    for c in files(REF + "/grad_probe/**/grad_summary_*.csv"):
        put("grad_csv", read(c) + b"\0" + manifest)
    for c in files(REF + "/configs/*.json", REF + "/grad_probe/configs/*.json", REF + "/run_ut/configs/*.json",
                   DATA + "/msprobe_residual/configs/*.json"):
        put("config", read(c))
    for p in files(REF + "/tensor_mix/**/*.pt", REF + "/run_ut/**/*.pt", DATA + "/golden/**/*.pt"):
        if os.path.getsize(p) <= 4096:
            put("pt", read(p))
    maps = [
        b"Functional.linear.0.forward: Functional.linear.0.forward\n",
        b"# a comment\nTorch.add.1.forward: 'Tensor.__add__.1.forward'\n",
        b"Functional.linear: [Aten.t, Aten.addmm] {input.0: 1.input.1, input.1: 0.input.0, output.0: 1.output.0}\n",
        b"[Aten.t, Aten.addmm]: Functional.linear {0.input.0: input.1}\n",
    ]
    for m in maps:
        put("compare_map", m)


if __name__ == "__main__":
    sys.exit(main())
