#pragma once
// A .pt file read back (compare's tensor mode, run_ut): its zip directory checked first
// (io/pt_archive.hpp), then handed to libtorch's torch::pickle_load, and the tensor it gives checked
// against its storage.
#include <caffe2/serialize/versions.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cerrno>
#include <cstdint>
#include <optional>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "torchprobe/io/pt_archive.hpp"

namespace torchprobe::io {

struct PtFileError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Why a tensor's sizes, strides and offset reach outside its storage, or nullopt. libtorch's
// Unpickler sets what the pickle says on the storage it read, unchecked: a pickle that claims
// sizes larger than its record would have every reader of the tensor read past the storage.
inline std::optional<std::string> tensor_extent_problem(const at::Tensor& t) {
  if (!t.has_storage() || t.is_sparse()) return std::nullopt;
  const std::int64_t offset = t.storage_offset();
  if (offset < 0) return "storage offset " + std::to_string(offset) + " is negative";
  // The last element's place, in elements; each step bounded, so that the sum cannot overflow.
  const std::int64_t room = static_cast<std::int64_t>(t.storage().nbytes() / t.element_size());
  std::int64_t last = offset;
  for (std::int64_t d = 0; d < t.dim(); ++d) {
    const std::int64_t size = t.size(d), stride = t.stride(d);
    if (size == 0) return std::nullopt;  // no element: nothing is read
    if (size < 0 || stride < 0) return std::string("a negative size or stride");
    if (size > 1 && stride > (room - last) / (size - 1))
      return "sizes " + c10::str(t.sizes()) + " and strides " + c10::str(t.strides()) + " reach past the " +
             std::to_string(room) + " elements of the storage record";
    last += (size - 1) * stride;
  }
  if (last >= room)
    return "sizes " + c10::str(t.sizes()) + " at offset " + std::to_string(offset) + " reach past the " +
           std::to_string(room) + " elements of the storage record";
  return std::nullopt;
}

// The value a .pt file holds. Throws PtFileError naming `file`: unreadable, not a zip whose records
// lie inside it (with the byte offset), or refused by libtorch (with its reason).
inline c10::IValue read_pt_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw PtFileError(file.string() + ": cannot be read (" + std::strerror(errno) + ")");
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string version;
  if (const auto problem = pt_archive_problem(std::string_view(bytes.data(), bytes.size()), &version))
    throw PtFileError(file.string() + ": not a readable .pt file: " + *problem);
  // What libtorch's reader then checks, without a leak when it fails (pt_archive.hpp).
  while (!version.empty() && (version.back() == '\n' || version.back() == ' ')) version.pop_back();
  const bool digits =
      !version.empty() && version.size() < 6 && version.find_first_not_of("0123456789") == std::string::npos;
  const std::uint64_t number = digits ? std::stoull(version) : 0;
  if (!digits || number < caffe2::serialize::kMinSupportedFileFormatVersion ||
      number > caffe2::serialize::kMaxSupportedFileFormatVersion)
    throw PtFileError(file.string() + ": not a readable .pt file: its version record says \"" + version +
                      "\", where this libtorch reads versions " +
                      std::to_string(caffe2::serialize::kMinSupportedFileFormatVersion) + " to " +
                      std::to_string(caffe2::serialize::kMaxSupportedFileFormatVersion));
  c10::IValue v;
  try {
    v = torch::pickle_load(bytes);
  } catch (const std::exception& e) {
    throw PtFileError(file.string() + ": not a readable .pt file (" + e.what() + ")");
  }
  if (v.isTensor())
    if (const auto problem = tensor_extent_problem(v.toTensor()))
      throw PtFileError(file.string() + ": not a readable .pt file: " + *problem);
  return v;
}

}  // namespace torchprobe::io
