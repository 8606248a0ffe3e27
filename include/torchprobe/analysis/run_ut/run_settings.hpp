#pragma once
// What one `torchprobe run_ut` is asked to do, free of libtorch: the command line and the config
// file fill it (cli_options.hpp), the runner reads it (runner.hpp's RunOptions adds the replay's
// device), so neither copies the other's fields.
#include <string>
#include <vector>

namespace torchprobe::run_ut {

struct RunSettings {
  std::string api_info;                             // -api_info: the dump.json to replay
  std::string out_dir = ".";                        // -o
  bool save_error_data = false;                     // -save_error_data
  std::string error_data_path = ".";                // config run_ut.error_data_path
  std::string continue_csv;                         // -csv_path: a result CSV to resume
  bool filter_duplicates = false;                   // -f
  int jobs = 1;                                     // -j
  std::vector<std::string> white_list, black_list;  // config run_ut.white_list / black_list
};

}  // namespace torchprobe::run_ut
