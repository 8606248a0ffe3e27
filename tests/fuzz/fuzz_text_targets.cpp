// The fuzz targets whose readers need no libtorch: compare's and ranks' dump readers, the journal
// reader of recovery, the .npy and CSV readers of grad-compare, and compare's --map reader.
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_target.hpp"
#include "torchprobe/analysis/compare/dump_rows_reader.hpp"
#include "torchprobe/analysis/compare/grad_compare.hpp"
#include "torchprobe/analysis/compare/ranks.hpp"
#include "torchprobe/analysis/compare/user_map.hpp"
#include "torchprobe/io/npy.hpp"
#include "torchprobe/io/recovery.hpp"

namespace torchprobe::fuzz {
namespace {

namespace fs = std::filesystem;

// Inputs that stand for several files hold them apart with NUL bytes, which no JSON, CSV or map
// text holds: dump.json, then stack.json, then construct.json (or rank0's, rank1's, ... dump.json).
std::vector<std::string_view> parts(std::string_view input, std::size_t most) {
  std::vector<std::string_view> out;
  while (out.size() + 1 < most) {
    const std::size_t nul = input.find('\0');
    if (nul == std::string_view::npos) break;
    out.push_back(input.substr(0, nul));
    input.remove_prefix(nul + 1);
  }
  out.push_back(input);
  return out;
}

// compare reads a dump with simdjson in pieces and, for what that reader leaves to it, with
// nlohmann's SAX reader; the fast reader again with small pieces, so that entries straddle them.
void dump_json(std::string_view input) {
  clear_scratch();
  const auto p = parts(input, 3);
  const fs::path dir = scratch() / "rank0";
  fs::create_directories(dir);
  write_bytes(dir / "dump.json", p[0]);
  if (p.size() > 1) write_bytes(dir / "stack.json", p[1]);
  if (p.size() > 2) write_bytes(dir / "construct.json", p[2]);
  try {
    (void)compare::load_dump_rows(dir / "dump.json");  // what compare does: the fast reader, else nlohmann's
  } catch (const std::exception&) {
  }
#if defined(TORCHPROBE_HAVE_SIMDJSON)
  try {
    (void)compare::details::dump_rows_in_pieces(dir / "dump.json", 4096);
  } catch (const compare::details::NotPlain&) {  // its signal to load_dump_rows: read it the other way
  } catch (const std::exception&) {
  }
#endif
}

// torchprobe ranks: one step directory, each part a rank's dump.json.
void ranks(std::string_view input) {
  clear_scratch();
  const auto p = parts(input, 4);
  const fs::path step = scratch() / "step0";
  for (std::size_t r = 0; r < p.size(); ++r) {
    fs::create_directories(step / ("rank" + std::to_string(r)));
    write_bytes(step / ("rank" + std::to_string(r)) / "dump.json", p[r]);
  }
  try {
    std::ostringstream out;
    (void)compare::ranks::print_views(compare::ranks::view_dump(scratch()), out);
  } catch (const std::exception&) {
  }
}

// ranks_digest.bin, as torchprobe ranks reads it: the input's first byte says what the rest is,
// odd: a digest's payload, packed with a valid header and checksum (what a fuzzer could never find
// through zlib and CRC-32); even: the whole file. It is rank 0's digest of a step whose rank 1 has a
// valid one, with and without dump.json files to fall back on.
void rank_digest(std::string_view input) {
  clear_scratch();
  if (input.empty()) return;
  const bool payload = (static_cast<unsigned char>(input[0]) & 1) != 0;
  input.remove_prefix(1);
  const std::string file = payload ? io::rank_digest_details::pack(std::string(input)) : std::string(input);
  try {
    (void)io::decode_rank_digest(file, "fuzz");
  } catch (const io::RankDigestError&) {
  }
  const fs::path step = scratch() / "step0";
  fs::create_directories(step / "rank0");
  fs::create_directories(step / "rank1");
  write_bytes(step / "rank0" / io::kRankDigestFile, file);
  write_bytes(step / "rank1" / io::kRankDigestFile, io::encode_rank_digest(io::RankDigest{}));
  for (const bool with_dumps : {false, true}) {
    if (with_dumps)
      for (const char* r : {"rank0", "rank1"})
        write_bytes(step / r / "dump.json", R"({"task": "statistics", "level": "L0", "data": {}})");
    try {
      std::ostringstream out;
      (void)compare::ranks::print_views(compare::ranks::view_dump(scratch()), out);
    } catch (const std::exception&) {
    }
  }
}

// torchprobe recover: a rank directory with this journal, rebuilt in place.
void journal(std::string_view input) {
  clear_scratch();
  const fs::path rank = scratch() / "step0" / "rank0";
  fs::create_directories(rank);
  write_bytes(rank / io::Journal::kFileName, input);
  // No catch: recover() reports a bad journal as its outcome, and `torchprobe recover` catches
  // nothing, so anything it throws would end the tool.
  std::ostringstream out, err;
  (void)io::recovery::details::recover(rank, /*check_only=*/false, /*keep_journal=*/false, out, err);
}

void npy(std::string_view input) {
  std::string why;
  if (const auto a = io::parse_npy(input, &why)) {
    // What grad-compare does with the values next: read every element the header announced.
    volatile unsigned char sink = 0;
    for (const char c : a->data) sink ^= static_cast<unsigned char>(c);
  }
}

// grad-compare: a grad_summary CSV's parameter names, then a run manifest (the part after a NUL).
void grad_csv(std::string_view input) {
  const auto p = parts(input, 2);
  try {
    (void)compare::grad::csv_param_names(std::string(p[0]));
  } catch (const std::exception&) {
  }
  if (p.size() < 2) return;
  clear_scratch();
  write_bytes(scratch() / grad_probe::kRunManifestName, p[1]);
  try {
    (void)grad_probe::read_run_manifest(scratch().string());
  } catch (const std::exception&) {
  }
}

void compare_map(std::string_view input) {
  clear_scratch();
  write_bytes(scratch() / "map.yaml", input);
  try {
    (void)compare::read_user_map(scratch() / "map.yaml");
  } catch (const std::exception&) {
  }
}

}  // namespace

const std::vector<Target>& text_targets() {
  static const std::vector<Target> targets = {
      {"dump_json", "dump.json (NUL) stack.json (NUL) construct.json, as compare reads them", dump_json},
      {"ranks", "rank0's dump.json (NUL) rank1's (NUL) ..., as torchprobe ranks reads a step", ranks},
      {"journal", "journal.jsonl of an interrupted step, as torchprobe recover rebuilds it", journal},
      {"rank_digest",
       "a byte (odd: a payload follows, even: a file), then ranks_digest.bin, as torchprobe ranks reads it",
       rank_digest},
      {"npy", ".npy file of grad_probe, as grad-compare reads it", npy},
      {"grad_csv", "grad_summary CSV (NUL) grad_probe_run.jsonl, as grad-compare reads them", grad_csv},
      {"compare_map", "compare's --map file", compare_map},
  };
  return targets;
}

}  // namespace torchprobe::fuzz
