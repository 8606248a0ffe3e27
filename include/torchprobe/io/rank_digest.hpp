#pragma once
// ranks_digest.bin: a rank's step in the few bytes the cross-rank view needs (issue 48, item 4),
// written by the probe beside dump.json (sink/step_digest.hpp) and by `torchprobe recover`, read by
// `torchprobe ranks` instead of dump.json when every rank of a step has one, so that a job's ranks
// can be looked at together without reading (or gathering) their dump.json files.
//
// It keeps what a data-parallel job holds the same on every rank and what the view reports: every
// collective entry (its inputs and outputs), every module's parameters, every parameters_grad entry
// (the view decides which are replicated, as it does from dump.json); per tensor its site
// ("parameters.weight"), its shape and a 64-bit hash of its statistics (io/rank_items.hpp, the
// same hash the view computes from dump.json); and the rank's first non-finite tensor, found over
// every entry. Each rank's own data (API calls, module inputs and outputs) is not in it.
//
// Layout (little-endian): "TPRD", u32 version (1), u32 payload size, u32 zlib-compressed size,
// u32 CRC-32 of the payload, then the compressed payload:
//   u32 strings, each u32 length + bytes (names, sites, shapes, the non-finite item, the note)
//   u64 entries of dump.json
//   u32 entries kept, each u32 name, u32 items, and per item u32 site, u32 shape, u64 hash
//   u8 has a non-finite tensor; then u32 entry, u32 item, u32 clock, u8 received, u8 inputs finite
//   u32 the recovery note (what a step recovered incomplete lacks) or 0xffffffff
// The reader checks every count and id against what the file holds: a file cut short, altered or
// made up is refused with an error that names it, never read past its end.
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "torchprobe/io/rank_items.hpp"

namespace torchprobe::io {

inline constexpr const char* kRankDigestFile = "ranks_digest.bin";

struct RankDigestError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A digest's content: ids index `strings`.
struct RankDigest {
  struct Item {
    std::uint32_t site = 0, shape = 0;
    std::uint64_t stats = 0;
  };
  struct Entry {
    std::uint32_t name = 0, first_item = 0, items = 0;  // its items: items[first_item, first_item + items)
  };
  std::vector<std::string> strings;
  std::uint64_t dump_entries = 0;  // how many entries the rank's dump.json has
  std::vector<Entry> entries;      // dump order
  std::vector<Item> items;
  std::optional<rank_items::RankFirst> nonfinite;
  std::string missing;  // a step recovered incomplete: what it lacks
};

// Builds a digest entry by entry, in dump order.
class RankDigestBuilder {
 public:
  // Does the digest keep an entry of this name (and whose body has "parameters" or not)?
  static bool keeps(std::string_view name, bool has_parameters) {
    return rank_items::is_collective(name) || rank_items::is_parameters_grad(name) || has_parameters;
  }

  // One entry of dump.json, its body as a JSON reader gives it.
  template <class Nodes>
  void add(std::string_view name, typename Nodes::Node body) {
    ++d_.dump_entries;
    if (!d_.nonfinite) {
      if (rank_items::nonfinite_in_entry<Nodes>(name, body, walk_)) d_.nonfinite = walk_;
    }
    typename Nodes::Node parameters;
    if (!keeps(name, Nodes::is_object(body) && Nodes::find(body, "parameters", parameters))) return;
    std::vector<std::pair<std::string, typename Nodes::Node>> found;
    rank_items::entry_items<Nodes>(name, body, found, rank_items::Sections::Replicated);
    d_.entries.push_back(
        {id(name), static_cast<std::uint32_t>(d_.items.size()), static_cast<std::uint32_t>(found.size())});
    for (const auto& [site, item] : found)
      d_.items.push_back(
          {id(site), id(rank_items::shape_text<Nodes>(item)), rank_items::stats_hash<Nodes>(item, key_)});
  }

  // An entry the digest does not keep (keeps() said so), walked by the caller for the non-finite
  // search: `input` and `output`, its first non-finite item on each side ("" for none).
  void add_unkept(std::string_view name, std::string input, std::string output) {
    ++d_.dump_entries;
    if (!d_.nonfinite && rank_items::nonfinite_found(name, std::move(input), std::move(output), walk_))
      d_.nonfinite = walk_;
  }
  bool nonfinite_found() const { return d_.nonfinite.has_value(); }

  void set_missing(std::string missing) { d_.missing = std::move(missing); }
  // The digest so far, its string table taken from the interner.
  const RankDigest& digest() {
    d_.strings = strings_.texts();
    return d_;
  }

 private:
  std::uint32_t id(std::string_view s) { return strings_.id(s); }

  RankDigest d_;
  rank_items::Interner strings_;
  rank_items::RankFirst walk_;  // the non-finite search so far (its clock)
  std::string key_;             // stats_hash's scratch space
};

namespace rank_digest_details {

inline constexpr std::uint32_t kVersion = 1;
inline constexpr std::uint32_t kNone = 0xffffffffu;
inline constexpr std::size_t kHeader = 20;
// A digest's payload is a few bytes per kept tensor; this bounds what a made-up size may allocate.
inline constexpr std::uint32_t kMaxPayload = 1u << 30;

inline void put32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}
inline void put64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

// Reads the payload; every read is checked against its end.
class Cursor {
 public:
  Cursor(std::string_view bytes, const std::string& path) : p_(bytes), path_(path) {}
  std::uint64_t get(int bytes, const char* what) {
    if (p_.size() - at_ < static_cast<std::size_t>(bytes)) fail(std::string("it ends inside ") + what);
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(p_[at_ + i])) << (8 * i);
    at_ += static_cast<std::size_t>(bytes);
    return v;
  }
  std::uint32_t u32(const char* what) { return static_cast<std::uint32_t>(get(4, what)); }
  std::string_view bytes(std::size_t n, const char* what) {
    if (p_.size() - at_ < n) fail(std::string("it ends inside ") + what);
    const std::string_view s = p_.substr(at_, n);
    at_ += n;
    return s;
  }
  // A count of records of at least `each` bytes: no more than the rest of the payload can hold.
  std::uint32_t count(std::size_t each, const char* what) {
    const std::uint32_t n = u32(what);
    if (static_cast<std::uint64_t>(n) * each > p_.size() - at_)
      fail(std::string("its count of ") + what + " (" + std::to_string(n) + ") is more than the file holds");
    return n;
  }
  bool done() const { return at_ == p_.size(); }
  [[noreturn]] void fail(const std::string& why) const {
    throw RankDigestError(path_ + ": not a readable " + kRankDigestFile + ": " + why);
  }

 private:
  std::string_view p_;
  std::size_t at_ = 0;
  const std::string& path_;
};

// The file around a payload: the header, then the payload compressed.
inline std::string pack(const std::string& p) {
  uLongf packed_size = compressBound(static_cast<uLong>(p.size()));
  std::string packed(packed_size, '\0');
  if (compress2(reinterpret_cast<Bytef*>(&packed[0]), &packed_size, reinterpret_cast<const Bytef*>(p.data()),
                static_cast<uLong>(p.size()), Z_BEST_SPEED) != Z_OK)
    throw RankDigestError(std::string("cannot compress a ") + kRankDigestFile + " (out of memory)");
  packed.resize(packed_size);
  std::string out = "TPRD";
  put32(out, kVersion);
  put32(out, static_cast<std::uint32_t>(p.size()));
  put32(out, static_cast<std::uint32_t>(packed.size()));
  put32(out,
        static_cast<std::uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(p.data()), static_cast<uInt>(p.size()))));
  return out + packed;
}

}  // namespace rank_digest_details

// The file's bytes.
inline std::string encode_rank_digest(const RankDigest& d) {
  using namespace rank_digest_details;
  // The non-finite tensor's and the note's texts join the string table: ids like the others.
  std::vector<const std::string*> strings;
  for (const std::string& s : d.strings) strings.push_back(&s);
  const auto text_id = [&](const std::string& s) {
    strings.push_back(&s);
    return static_cast<std::uint32_t>(strings.size() - 1);
  };
  std::string tail;
  tail += static_cast<char>(d.nonfinite ? 1 : 0);
  if (d.nonfinite) {
    put32(tail, text_id(d.nonfinite->entry));
    put32(tail, text_id(d.nonfinite->item));
    put32(tail, static_cast<std::uint32_t>(d.nonfinite->clock));
    tail += static_cast<char>(d.nonfinite->received ? 1 : 0);
    tail += static_cast<char>(d.nonfinite->inputs_finite ? 1 : 0);
  }
  put32(tail, d.missing.empty() ? kNone : text_id(d.missing));
  std::string p;
  put32(p, static_cast<std::uint32_t>(strings.size()));
  for (const std::string* s : strings) {
    put32(p, static_cast<std::uint32_t>(s->size()));
    p += *s;
  }
  put64(p, d.dump_entries);
  put32(p, static_cast<std::uint32_t>(d.entries.size()));
  for (const RankDigest::Entry& e : d.entries) {
    put32(p, e.name);
    put32(p, e.items);
    for (std::uint32_t k = e.first_item; k < e.first_item + e.items; ++k) {
      put32(p, d.items[k].site);
      put32(p, d.items[k].shape);
      put64(p, d.items[k].stats);
    }
  }
  p += tail;
  return rank_digest_details::pack(p);
}

// A digest from its bytes; `path` names it in errors (RankDigestError).
inline RankDigest decode_rank_digest(std::string_view file, const std::string& path) {
  using namespace rank_digest_details;
  Cursor head(file, path);
  if (file.size() < kHeader || file.substr(0, 4) != "TPRD")
    head.fail("it does not begin with TorchProbe's digest header");
  head.bytes(4, "the header");
  const std::uint32_t version = head.u32("the header");
  if (version != kVersion)
    head.fail("its version is " + std::to_string(version) + "; this build reads version " + std::to_string(kVersion));
  const std::uint32_t size = head.u32("the header"), packed = head.u32("the header"), crc = head.u32("the header");
  if (packed != file.size() - kHeader)
    head.fail("it holds " + std::to_string(file.size() - kHeader) + " bytes of data where its header says " +
              std::to_string(packed));
  if (size > kMaxPayload) head.fail("its size (" + std::to_string(size) + " bytes) is past the limit");
  std::string p(size, '\0');
  uLongf got = size;
  if (size > 0 &&
      (uncompress(reinterpret_cast<Bytef*>(&p[0]), &got, reinterpret_cast<const Bytef*>(file.data() + kHeader),
                  static_cast<uLong>(packed)) != Z_OK ||
       got != size))
    head.fail("its data does not inflate to the size its header says");
  if (crc32(0L, reinterpret_cast<const Bytef*>(p.data()), static_cast<uInt>(p.size())) != crc)
    head.fail("its checksum does not match its data");
  Cursor c(p, path);
  RankDigest d;
  const std::uint32_t strings = c.count(4, "strings");
  d.strings.reserve(strings);
  for (std::uint32_t i = 0; i < strings; ++i) d.strings.emplace_back(c.bytes(c.u32("a string"), "a string"));
  const auto text = [&](const char* what) {
    const std::uint32_t id = c.u32(what);
    if (id >= d.strings.size())
      c.fail(std::string(what) + " is string " + std::to_string(id) + ", past the " + std::to_string(d.strings.size()) +
             " strings");
    return id;
  };
  d.dump_entries = c.get(8, "the entry count");
  const std::uint32_t entries = c.count(8, "entries");
  d.entries.reserve(entries);
  for (std::uint32_t i = 0; i < entries; ++i) {
    RankDigest::Entry e;
    e.name = text("entry name");
    e.items = c.count(16, "items");
    e.first_item = static_cast<std::uint32_t>(d.items.size());
    for (std::uint32_t k = 0; k < e.items; ++k) {
      RankDigest::Item item;
      item.site = text("tensor site");
      item.shape = text("tensor shape");
      item.stats = c.get(8, "a tensor's hash");
      d.items.push_back(item);
    }
    d.entries.push_back(e);
  }
  if (d.entries.size() > d.dump_entries) c.fail("it keeps more entries than it says dump.json has");
  const std::uint64_t has_nonfinite = c.get(1, "the non-finite tensor");
  if (has_nonfinite > 1) c.fail("its non-finite flag is neither 0 nor 1");
  if (has_nonfinite) {
    rank_items::RankFirst f;
    f.entry = d.strings[text("non-finite entry")];
    f.item = d.strings[text("non-finite item")];
    f.clock = static_cast<long>(c.u32("the non-finite tensor"));
    f.received = c.get(1, "the non-finite tensor") != 0;
    f.inputs_finite = c.get(1, "the non-finite tensor") != 0;
    d.nonfinite = std::move(f);
  }
  const std::uint32_t note = c.u32("the recovery note");
  if (note != kNone) {
    if (note >= d.strings.size()) c.fail("its recovery note names no string");
    d.missing = d.strings[note];
  }
  if (!c.done()) c.fail("it has bytes after its end");
  return d;
}

inline RankDigest read_rank_digest(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw RankDigestError(path + ": cannot be opened");
  const std::streamoff size = in.tellg();
  if (size < 0) throw RankDigestError(path + ": cannot be read");
  std::string bytes(static_cast<std::size_t>(size), '\0');
  in.seekg(0);
  if (!in.read(bytes.data(), size)) throw RankDigestError(path + ": cannot be read");
  return decode_rank_digest(bytes, path);
}

}  // namespace torchprobe::io
