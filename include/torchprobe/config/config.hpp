#pragma once
// The configuration: its types (config/types.hpp) and parse_config / load_config_file
// (config/parser.hpp).
#include "torchprobe/config/parser.hpp"
#include "torchprobe/config/types.hpp"
