#pragma once
// One fuzz target: a reader of files that TorchProbe's tools take from others, fed one input.
// Every target catches what a reader throws on purpose (its refusal, which names the file and what
// was wrong); what is left to find is a crash, a hang, a leak or an unbounded allocation, which the
// sanitizers and libFuzzer report.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace torchprobe::fuzz {

struct Target {
  const char* name;
  const char* reads;  // what the target reads, for the listing
  void (*run)(std::string_view input);
};

// The targets without libtorch (fuzz_text_targets.cpp) and with it (fuzz_torch_targets.cpp).
const std::vector<Target>& text_targets();
const std::vector<Target>& torch_targets();

// A scratch directory of this process, emptied between inputs by the targets that write files.
const std::filesystem::path& scratch();
void write_bytes(const std::filesystem::path& file, std::string_view bytes);
void clear_scratch();

}  // namespace torchprobe::fuzz
