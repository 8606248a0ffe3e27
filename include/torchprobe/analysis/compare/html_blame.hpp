#pragma once
// report.html's "Blame by replay" section (blame_plan.hpp's "blame", or for statistics dumps the
// "suspects" with their amplification): one small table under the answer.
#include <nlohmann/json.hpp>

#include <string>

#include "torchprobe/analysis/compare/html_table.hpp"
#include "torchprobe/analysis/compare/html_text.hpp"

namespace torchprobe::compare::html {

inline std::string figure(const nlohmann::ordered_json& o, const char* key) {
  if (!o.contains(key)) return "";
  const auto& v = o[key];
  return v.is_number() ? number(v.get<double>()) : escape(v.is_string() ? v.get<std::string>() : v.dump());
}

inline std::string blame_section(const nlohmann::ordered_json& report) {
  std::string s;
  if (report.contains("blame")) {
    s += "<h2>Blame by replay</h2><p id=\"blame-summary\"><b>" + escape(report.value("blame_summary", "")) +
         "</b></p><p class=\"meta\">Each op replayed on the bench's inputs: <i>local</i> is what it adds, "
         "<i>propagated</i> what it was given; errors against float64 replays of each side's op.</p>"
         "<table><thead><tr><th>entry</th><th>verdict</th><th>local</th><th>propagated</th>"
         "<th>target vs float64</th><th>bench vs float64</th><th>why</th></tr></thead><tbody>";
    for (const auto& o : report["blame"])
      s += "<tr><td><code>" + escape(o.value("entry", "")) + "</code></td><td>" + escape(o.value("verdict", "")) +
           "</td><td>" + figure(o, "local") + "</td><td>" + figure(o, "propagated") + "</td><td>" +
           figure(o, "target_error_vs_float64") + "</td><td>" + figure(o, "bench_error_vs_float64") + "</td><td>" +
           escape(o.value("why", "")) + "</td></tr>";
    s += "</tbody></table>\n";
  } else if (report.contains("suspects")) {
    s += "<h2>Suspects</h2><p class=\"meta\">Statistics dumps: how many times each diverging entry's output "
         "error is its inputs'. Dump their tensors (<code>--emit-config</code>) and compare again to blame "
         "them by replay.</p><table><thead><tr><th>entry</th><th>input error</th><th>output error</th>"
         "<th>amplification</th></tr></thead><tbody>";
    for (const auto& o : report["suspects"])
      s += "<tr><td><code>" + escape(o.value("entry", "")) + "</code></td><td>" + figure(o, "input_error") +
           "</td><td>" + figure(o, "output_error") + "</td><td>" + figure(o, "amplification") + "</td></tr>";
    s += "</tbody></table>\n";
  }
  return s;
}

}  // namespace torchprobe::compare::html
