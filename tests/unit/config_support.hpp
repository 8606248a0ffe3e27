#pragma once
// Helpers shared by the config tests: a minimal valid document, and the message a document is
// rejected with.
#include <string>

#include <nlohmann/json.hpp>

#include "torchprobe/config/config.hpp"

namespace tptest {

// A minimal valid document plus the given keys.
inline nlohmann::json doc_with(nlohmann::json extra) {
  nlohmann::json doc = {{"dump_path", "./dump"}};
  doc.update(extra);
  return doc;
}

// The message parse_config rejects the document with, or "(accepted)".
inline std::string rejection(const nlohmann::json& doc, const torchprobe::TaskCatalog* implemented = nullptr) {
  try {
    torchprobe::parse_config(doc, implemented);
  } catch (const torchprobe::ConfigError& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace tptest
