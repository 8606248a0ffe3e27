#pragma once
// The pictures of `torchprobe grad-compare`: one SVG line plot of similarity by step per parameter
// (msprobe draws PNGs with matplotlib; SVG needs no plotting library), and summary.html, one
// self-contained page with every curve inline and the steps msprobe's guide calls suspicious marked:
// a similarity below 0.97 at the first step, or a drop of more than 0.03 from one step to the next.
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "torchprobe/analysis/compare/html_text.hpp"

namespace torchprobe::compare::grad {

struct Curve {
  std::string name;
  std::vector<std::optional<double>> values;  // by step; nullopt where a file was missing
  std::vector<bool> flagged;                  // suspicious at this step
};

inline constexpr double kFirstStepMin = 0.97;
inline constexpr double kMaxDrop = 0.03;

namespace html {

using compare::html::escape;

inline std::string num(double v, const char* fmt = "%.1f") {
  char buf[32];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

// Marks each curve's suspicious steps (the first compared step below 0.97; a drop > 0.03 since the
// previous step with a value).
inline std::vector<Curve> curves_of(const std::vector<std::string>& rows,
                                    const std::vector<std::vector<std::optional<double>>>& values) {
  std::vector<Curve> curves;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    Curve c{rows[r], values[r], std::vector<bool>(values[r].size(), false)};
    std::optional<double> previous;
    for (std::size_t k = 0; k < c.values.size(); ++k) {
      if (!c.values[k]) continue;
      const double v = *c.values[k];
      if (k == 0 && v < kFirstStepMin) c.flagged[k] = true;
      if (previous && *previous - v > kMaxDrop) c.flagged[k] = true;
      previous = v;
    }
    curves.push_back(std::move(c));
  }
  return curves;
}

inline std::vector<std::string> suspicious_steps(const std::vector<Curve>& curves,
                                                 const std::vector<std::int64_t>& steps) {
  std::vector<std::string> out;
  for (const Curve& c : curves)
    for (std::size_t k = 0; k < c.values.size(); ++k) {
      if (!c.flagged[k]) continue;
      std::string why = k == 0 ? " < 0.97 at the first step" : " dropped by more than 0.03 since the step before";
      out.push_back(c.name + ": step " + std::to_string(steps[k]) + " similarity " + num(*c.values[k], "%.4f") + why);
    }
  return out;
}

// Similarity (0..1) by step, suspicious steps as red dots.
inline std::string svg_plot(const Curve& c, const std::vector<std::int64_t>& steps) {
  const double w = 480, h = 240, left = 48, right = 16, top = 28, bottom = 36;
  const double pw = w - left - right, ph = h - top - bottom;
  const std::size_t n = steps.size();
  auto x = [&](std::size_t k) {
    return left + (n <= 1 ? pw / 2 : pw * static_cast<double>(k) / static_cast<double>(n - 1));
  };
  auto y = [&](double v) { return top + ph * (1.0 - v); };
  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(w, "%.0f") + "\" height=\"" +
                  num(h, "%.0f") + "\" viewBox=\"0 0 " + num(w, "%.0f") + " " + num(h, "%.0f") +
                  "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  s += "<title>" + escape(c.name) + " similarities</title>\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s +=
      "<text x=\"" + num(w / 2) + "\" y=\"16\" text-anchor=\"middle\" font-size=\"13\">" + escape(c.name) + "</text>\n";
  for (double v : {0.0, 0.25, 0.5, 0.75, 1.0}) {
    s += "<line x1=\"" + num(left) + "\" x2=\"" + num(left + pw) + "\" y1=\"" + num(y(v)) + "\" y2=\"" + num(y(v)) +
         "\" stroke=\"#ddd\"/>\n";
    s += "<text x=\"" + num(left - 6) + "\" y=\"" + num(y(v) + 4) + "\" text-anchor=\"end\">" + num(v, "%.2f") +
         "</text>\n";
  }
  s += "<line x1=\"" + num(left) + "\" x2=\"" + num(left + pw) + "\" y1=\"" + num(y(kFirstStepMin)) + "\" y2=\"" +
       num(y(kFirstStepMin)) + "\" stroke=\"#e99\" stroke-dasharray=\"4 3\"/>\n";
  const std::size_t label_every = n > 12 ? (n + 11) / 12 : 1;
  for (std::size_t k = 0; k < n; k += label_every)
    s += "<text x=\"" + num(x(k)) + "\" y=\"" + num(top + ph + 16) + "\" text-anchor=\"middle\">" +
         std::to_string(steps[k]) + "</text>\n";
  s += "<text x=\"" + num(left + pw / 2) + "\" y=\"" + num(h - 4) + "\" text-anchor=\"middle\">step</text>\n";
  std::string points;
  for (std::size_t k = 0; k < n; ++k)
    if (c.values[k]) points += num(x(k)) + "," + num(y(*c.values[k])) + " ";
  s += "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"" + points + "\"/>\n";
  for (std::size_t k = 0; k < n; ++k) {
    if (!c.values[k]) continue;
    s += "<circle cx=\"" + num(x(k)) + "\" cy=\"" + num(y(*c.values[k])) + "\" r=\"" + (c.flagged[k] ? "5" : "3") +
         "\" fill=\"" + (c.flagged[k] ? "#d62728" : "#1f77b4") + "\"><title>step " + std::to_string(steps[k]) + ": " +
         num(*c.values[k], "%.6f") + (c.flagged[k] ? " (suspicious)" : "") + "</title></circle>\n";
  }
  return s + "</svg>\n";
}

inline std::string summary_page(const std::string& rank, const std::string& run_a, const std::string& run_b,
                                const std::vector<std::int64_t>& steps, const std::vector<Curve>& curves,
                                const std::vector<std::string>& flagged, const std::vector<std::string>& problems,
                                const std::vector<Curve>& sign_curves) {
  std::string p = "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>grad-compare " + escape(rank) +
                  "</title>\n<style>body{font-family:sans-serif;margin:1.5em}figure{display:inline-block;margin:"
                  "0.5em}.bad{color:#d62728}</style></head><body>\n";
  p += "<h1>Gradient direction similarity, " + escape(rank) + "</h1>\n<p>Run A: <code>" + escape(run_a) +
       "</code><br>Run B: <code>" + escape(run_b) + "</code><br>" + std::to_string(steps.size()) +
       " common step(s). Similarity: the fraction of elements whose gradient sign (&gt; 0 or not) agrees; "
       "<code>summary</code> weighs every element of the step.</p>\n";
  p += "<h2>Suspicious steps</h2>\n";
  if (flagged.empty())
    p += "<p>None (first step &ge; 0.97, no drop &gt; 0.03).</p>\n";
  else {
    p += "<ul class=\"bad\">\n";
    for (const std::string& f : flagged) p += "<li>" + escape(f) + "</li>\n";
    p += "</ul>\n";
  }
  if (!problems.empty()) {
    p += "<h2>Missing files</h2>\n<ul>\n";
    for (const std::string& m : problems) p += "<li>" + escape(m) + "</li>\n";
    p += "</ul>\n";
  }
  p += "<h2>Curves</h2>\n";
  for (std::size_t i = curves.size(); i-- > 0;)  // summary first
    p += "<figure>" + svg_plot(curves[i], steps) + "</figure>\n";
  if (!sign_curves.empty()) {
    p += "<h2>Three-state sign agreement (&minus;, 0, +)</h2>\n";
    for (std::size_t i = sign_curves.size(); i-- > 0;)
      p += "<figure>" + svg_plot(sign_curves[i], steps) + "</figure>\n";
  }
  return p + "</body></html>\n";
}

}  // namespace html

}  // namespace torchprobe::compare::grad
