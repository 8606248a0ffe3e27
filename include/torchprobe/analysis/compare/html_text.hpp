#pragma once
// Text put into the HTML pages the tools write (compare's report.html, grad-compare's summary.html).
#include <string>
#include <string_view>

namespace torchprobe::compare::html {

inline std::string escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace torchprobe::compare::html
