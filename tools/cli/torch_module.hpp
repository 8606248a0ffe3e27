#pragma once
// The tool's libtorch part (torch_module.cpp), loaded with dlopen the first time a command needs it.
// Linking libtorch into the tool itself made every command pay for it at start: 0.6 s and 160 MB
// before the first byte of a dump was read, which is most of a small compare and a tenth of a
// million-entry one. The module lies beside the tool in the build tree and in
// TORCHPROBE_CLI_MODULE_DIR (relative to the tool's directory) once installed.
#include <array>
#include <filesystem>
#include <string>
#include <vector>

#define TORCHPROBE_CLI_MODULE_EXPORT __attribute__((visibility("default")))

#if !defined(TORCHPROBE_CLI_MODULE_BUILD)
#include <dlfcn.h>

#include <stdexcept>
#include <system_error>

namespace torchprobe_cli {

class TorchModule {
 public:
  using PtCells = void (*)(const std::filesystem::path*, const std::filesystem::path*, std::array<std::string, 6>*,
                           std::string*);
  using RunUt = int (*)(const std::vector<std::string>*);
  // Blame by replay: a request (JSON text, blame_plan.hpp) in, the answer (JSON text) or an error out.
  using Blame = void (*)(const std::string* request, std::string* answer, std::string* error);

  // The module, loaded on the first call; throws std::runtime_error naming the places searched.
  static TorchModule& get() {
    static TorchModule module;
    return module;
  }

  PtCells pt_cells = nullptr;
  RunUt run_ut = nullptr;
  Blame blame = nullptr;

 private:
  TorchModule() {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path tool_dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
    const fs::path candidates[] = {tool_dir / TORCHPROBE_CLI_MODULE_NAME,
                                   tool_dir / TORCHPROBE_CLI_MODULE_DIR / TORCHPROBE_CLI_MODULE_NAME};
    std::string tried;
    for (const fs::path& file : candidates) {
      if (!fs::exists(file, ec)) {
        tried += "\n  " + file.lexically_normal().string() + ": not there";
        continue;
      }
      handle_ = ::dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle_ == nullptr) {
        const char* why = ::dlerror();
        tried += "\n  " + file.lexically_normal().string() + ": " + (why ? why : "cannot be loaded");
        continue;
      }
      pt_cells = reinterpret_cast<PtCells>(::dlsym(handle_, "torchprobe_cli_pt_cells"));
      run_ut = reinterpret_cast<RunUt>(::dlsym(handle_, "torchprobe_cli_run_ut"));
      blame = reinterpret_cast<Blame>(::dlsym(handle_, "torchprobe_cli_blame"));
      if (pt_cells != nullptr && run_ut != nullptr && blame != nullptr) return;
      tried += "\n  " + file.lexically_normal().string() + ": not this version's module (its functions are missing)";
      ::dlclose(handle_);
      handle_ = nullptr;
    }
    throw std::runtime_error(std::string("this command needs libtorch, through the tool's module ") +
                             TORCHPROBE_CLI_MODULE_NAME + ", which could not be loaded:" + tried);
  }
  void* handle_ = nullptr;  // never closed: libtorch's static state outlives main
};

}  // namespace torchprobe_cli
#endif
