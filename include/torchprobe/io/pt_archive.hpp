#pragma once
// A .pt file's zip directory checked before libtorch reads it. libtorch's reader (miniz under
// PyTorchStreamReader, as torch::pickle_load uses it) trusts the directory: it allocates the size
// an entry claims and reads at the offset it claims. A file from elsewhere -- truncated, damaged
// or made to harm -- is refused here instead, with the byte offset of what is wrong, so that what
// libtorch is handed holds only records that lie inside the file and are no larger than it.
//
// What torch.save writes: a zip (zip64 when large) of stored records -- "ARCHIVE/data.pkl",
// "ARCHIVE/data/N" (the storages), "ARCHIVE/version" and a few more -- in one directory at the end.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <zlib.h>

#include "torchprobe/io/pickle_scan.hpp"

namespace torchprobe::io {

// The most records a .pt file may hold: torch.save writes a handful plus one per storage.
inline constexpr std::uint64_t kMostPtRecords = std::uint64_t(1) << 20;

// Why `bytes` is not a zip that libtorch may be handed, or nullopt when every record's name, size
// and offset lies inside the file. Compressed records (torch.save stores, but a zip tool may
// deflate) may claim at most deflate's largest ratio, 1032:1.
// `version`, when given, receives the text of the archive's version record ("ARCHIVE/version" or
// "ARCHIVE/.data/version"), which must be there: libtorch's reader leaks its zip state when its
// constructor throws (PyTorchStreamReader::init, libtorch 1.13 to 2.x), so each thing it checks --
// a first record inside a folder, a version record -- is checked here first.
inline std::optional<std::string> pt_archive_problem(std::string_view bytes, std::string* version = nullptr) {
  using details::le;
  const std::uint64_t n = bytes.size();
  const auto at = [](std::uint64_t offset, const std::string& what) {
    return "at byte " + std::to_string(offset) + ": " + what;
  };
  if (n < 4 || bytes.substr(0, 4) != std::string_view("PK\x03\x04", 4))
    return std::string("not a zip archive (a .pt file is what torch.save writes: a zip, starting \"PK\\3\\4\")");
  // The end of central directory record: 22 bytes and a comment of up to 65535 at the very end.
  // The records are found as miniz finds them, so that both read the same directory: the signature
  // nearest the end, and the zip64 record whenever a zip64 locator sits right before it.
  std::optional<std::uint64_t> eocd;
  for (std::uint64_t back = 22; back <= n && back <= 22 + 65535 && !eocd; ++back)
    if (bytes.substr(n - back, 4) == std::string_view("PK\x05\x06", 4)) eocd = n - back;
  if (!eocd) return std::string("no zip directory at the end of the file (truncated?)");
  if (le(bytes, *eocd + 20, 2) != n - *eocd - 22)
    return at(*eocd, "the zip's end record says its comment is " + std::to_string(le(bytes, *eocd + 20, 2)) +
                         " bytes, where " + std::to_string(n - *eocd - 22) + " follow");
  std::uint64_t records = le(bytes, *eocd + 10, 2), dir_size = le(bytes, *eocd + 12, 4),
                dir_at = le(bytes, *eocd + 16, 4), dir_end = *eocd;
  if (le(bytes, *eocd + 4, 2) != 0 || le(bytes, *eocd + 6, 2) != 0 || le(bytes, *eocd + 8, 2) != records)
    return at(*eocd, "a zip split over several disks");
  if (*eocd >= 20 + 56 && bytes.substr(*eocd - 20, 4) == std::string_view("PK\x06\x07", 4)) {  // zip64
    const std::uint64_t z = le(bytes, *eocd - 20 + 8, 8);
    if (z > *eocd - 20 || *eocd - 20 - z < 56 || bytes.substr(z, 4) != std::string_view("PK\x06\x06", 4))
      return at(*eocd - 20, "the zip64 locator points to " + std::to_string(z) + ", where no zip64 record is");
    if (le(bytes, z + 16, 4) != 0 || le(bytes, z + 20, 4) != 0 || le(bytes, z + 24, 8) != le(bytes, z + 32, 8))
      return at(z, "a zip64 split over several disks");
    records = le(bytes, z + 32, 8);
    dir_size = le(bytes, z + 40, 8);
    dir_at = le(bytes, z + 48, 8);
    dir_end = z;
  }
  if (dir_at > dir_end || dir_size > dir_end - dir_at)
    return at(dir_end, "the zip directory claims bytes " + std::to_string(dir_at) + " + " + std::to_string(dir_size) +
                           ", past its own end");
  if (records == 0) return at(dir_end, "an empty zip (no records)");
  if (records > kMostPtRecords || records > dir_size / 46)
    return at(dir_end, "the zip directory claims " + std::to_string(records) + " records, more than its " +
                           std::to_string(dir_size) + " bytes hold");
  std::uint64_t p = dir_at;
  std::string_view folder;  // "ARCHIVE/": where the first record lies, and so every record libtorch looks up
  std::optional<std::string_view> version_text;
  for (std::uint64_t r = 0; r < records; ++r) {
    if (dir_at + dir_size - p < 46 || bytes.substr(p, 4) != std::string_view("PK\x01\x02", 4))
      return at(p, "record " + std::to_string(r) + " of the zip directory is not a directory entry");
    const std::uint64_t flags = le(bytes, p + 8, 2), method = le(bytes, p + 10, 2), name_len = le(bytes, p + 28, 2),
                        extra_len = le(bytes, p + 30, 2), comment_len = le(bytes, p + 32, 2);
    std::uint64_t packed = le(bytes, p + 20, 4), size = le(bytes, p + 24, 4), local = le(bytes, p + 42, 4);
    const std::uint64_t end = p + 46 + name_len + extra_len + comment_len;
    if (end > dir_at + dir_size) return at(p, "directory entry " + std::to_string(r) + " runs past the directory");
    if (name_len == 0) return at(p, "directory entry " + std::to_string(r) + " has no name");
    if (flags & (1 | 0x20 | 0x40))  // encrypted, a patch, strong encryption: what miniz refuses
      return at(p, "record " + std::to_string(r) + " is encrypted or a patch (flags " + std::to_string(flags) + ")");
    // The zip64 extra field holds, in this order, the sizes and the offset the entry marks 0xFFFFFFFF.
    for (std::uint64_t e = p + 46 + name_len; e + 4 <= p + 46 + name_len + extra_len;) {
      const std::uint64_t id = le(bytes, e, 2), len = le(bytes, e + 2, 2);
      if (e + 4 + len > p + 46 + name_len + extra_len) return at(e, "an extra field runs past its entry");
      if (id == 1) {
        std::uint64_t f = e + 4;
        for (std::uint64_t* v : {&size, &packed, &local}) {
          if (*v != 0xFFFFFFFF) continue;
          if (f + 8 > e + 4 + len) return at(e, "a zip64 field too short for the sizes it stands for");
          *v = le(bytes, f, 8);
          f += 8;
        }
      }
      e += 4 + len;
    }
    if (method == 0 ? size != packed : method != 8 || size / 1032 > packed)
      return at(p, "record " + std::to_string(r) + " claims " + std::to_string(size) + " bytes from " +
                       std::to_string(packed) + " stored (method " + std::to_string(method) + ")");
    if (local > dir_at || dir_at - local < 30 || bytes.substr(local, 4) != std::string_view("PK\x03\x04", 4))
      return at(
          p, "record " + std::to_string(r) + " points to byte " + std::to_string(local) + ", where no record starts");
    const std::uint64_t data = local + 30 + le(bytes, local + 26, 2) + le(bytes, local + 28, 2);
    if (data > dir_at || packed > dir_at - data)
      return at(local, "record " + std::to_string(r) + " claims " + std::to_string(packed) +
                           " bytes, past the start of the directory at " + std::to_string(dir_at));
    const std::string_view name = bytes.substr(p + 46, name_len);
    // miniz takes a record for a directory (and reads nothing of it) by a trailing '/' or the DOS
    // directory bit of its external attributes; torch.save writes files only.
    if (name.back() == '/' || (le(bytes, p + 38, 4) & 0x10) != 0)
      return at(p, "record " + std::to_string(r) + " (\"" + std::string(name) + "\") is marked a directory");
    if (r == 0) {
      const std::size_t slash = name.find('/');
      if (slash == std::string_view::npos) return at(p, "the first record is not inside a folder (\"ARCHIVE/...\")");
      folder = name.substr(0, slash + 1);
    }
    const bool in_folder = name.size() > folder.size() && name.substr(0, folder.size()) == folder;
    const std::string_view base = in_folder ? name.substr(folder.size()) : std::string_view();
    if (method == 0 && (base == "version" || base == ".data/version")) {
      // libtorch reads it in its constructor, where a CRC error leaks (see above): checked here.
      version_text = bytes.substr(data, packed);
      const auto crc =
          ::crc32(0L, reinterpret_cast<const Bytef*>(version_text->data()), static_cast<uInt>(version_text->size()));
      if (crc != le(bytes, p + 16, 4)) return at(data, "the version record's CRC-32 does not match its bytes");
    }
    if (base == "data.pkl") {  // the pickle libtorch runs: walked first (io/pickle_scan.hpp)
      if (method != 0) return at(p, "\"" + std::string(name) + "\" is compressed (torch.save stores it)");
      if (auto problem = pickle_problem(bytes.substr(data, packed))) return at(data, *problem);
    }
    p = end;
  }
  if (!version_text) return at(dir_at, "no stored version record (\"" + std::string(folder) + "version\")");
  if (version) *version = std::string(*version_text);
  return std::nullopt;
}

}  // namespace torchprobe::io
