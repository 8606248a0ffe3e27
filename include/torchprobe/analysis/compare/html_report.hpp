#pragma once
// report.html of `torchprobe compare`: one self-contained page (inline SVG, CSS and a little script,
// nothing fetched) for a person looking for the divergence:
//   - the answer first: the source entry (or the first diverging one), the first overflows;
//   - each paired entry's output error against its execution index, log scale, with the threshold
//     line and the source marked;
//   - the module tree of the target (construct.json) coloured pass / warning / error;
//   - a table of every paired entry (sortable by any column) with how it was matched;
//   - the source's stack (stack.json).
// Everything is drawn here, in C++; the script only sorts the table and folds the tree, so the page
// reads the same with scripts off.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "torchprobe/analysis/compare/first_divergence.hpp"
#include "torchprobe/analysis/compare/html_blame.hpp"
#include "torchprobe/analysis/compare/html_table.hpp"
#include "torchprobe/analysis/compare/html_text.hpp"

namespace torchprobe::compare {

namespace html {

inline const char* kStyle = R"(
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em;margin:0 0 .3em}h2{font-size:1.15em;margin:1.4em 0 .4em}
.answer{border-left:6px solid #c62828;background:#fdecea;padding:.6em 1em}
.answer.clean{border-color:#2e7d32;background:#e8f5e9}
code{background:#f2f2f2;padding:0 .25em}
.pass{color:#2e7d32}.warning{color:#ef6c00}.error{color:#c62828;font-weight:600}.unpaired{color:#888}
table{border-collapse:collapse;font-size:12px}th,td{border:1px solid #ddd;padding:2px 6px;text-align:left}
th{background:#f5f5f5;cursor:pointer;user-select:none}td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.source td{background:#fdecea}ul.tree{list-style:none;padding-left:1.2em}ul.tree li::before{content:"\25aa  "}
details summary{cursor:pointer}.meta{color:#555}
)";

// Sorts the table by the clicked column (numbers by data-key) and reports that it ran.
inline const char* kScript = R"(
(function(){
  var table=document.getElementById('entries');
  var heads=table.tHead.rows[0].cells;
  for(var c=0;c<heads.length;c++){(function(col){heads[col].addEventListener('click',function(){
    var body=table.tBodies[0];var rows=Array.prototype.slice.call(body.rows);
    var up=heads[col].getAttribute('data-up')!=='1';heads[col].setAttribute('data-up',up?'1':'0');
    rows.sort(function(a,b){var x=a.cells[col],y=b.cells[col];
      var kx=x.getAttribute('data-key'),ky=y.getAttribute('data-key');
      var r=(kx!==null&&ky!==null)?(parseFloat(kx)-parseFloat(ky)):x.textContent.localeCompare(y.textContent);
      return up?r:-r;});
    rows.forEach(function(r){body.appendChild(r);});});})(c);}
  document.body.setAttribute('data-ready','1');
})();
)";

// Error (log scale) against the execution index; zero errors on the bottom line (0), infinite ones
// on the top line; the threshold as a dashed line; the source circled and named.
inline std::string error_chart(const Judgement& j) {
  const double W = 900, H = 260, L = 60, R = 20, T = 20, B = 40;
  double lo = 1e-3, hi = std::max(10.0, j.threshold * 10);
  for (const EntryVerdict& v : j.verdicts) {
    const double e = v.output_error;
    if (std::isfinite(e) && e > 0) {
      lo = std::min(lo, e);
      hi = std::max(hi, e);
    }
  }
  lo = std::pow(10, std::floor(std::log10(lo)));
  hi = std::pow(10, std::ceil(std::log10(hi)));
  const std::size_t n = std::max<std::size_t>(j.verdicts.size(), 1);
  const auto x_of = [&](std::size_t i) { return L + (W - L - R) * (n == 1 ? 0.5 : double(i) / double(n - 1)); };
  const double Z = 16;  // a band under the lowest decade for errors of exactly zero
  const auto y_of = [&](double e) {
    if (!(e > 0)) return H - B;  // zero (and nan) on the floor
    if (std::isinf(e)) return T;
    return (H - B - Z) - (H - B - Z - T) * (std::log10(e) - std::log10(lo)) / (std::log10(hi) - std::log10(lo));
  };
  std::string s = "<svg id=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" + number(W) + "\" height=\"" +
                  number(H) + "\" role=\"img\" aria-label=\"output error per paired entry\">";
  s += "<rect x=\"" + number(L) + "\" y=\"" + number(T) + "\" width=\"" + number(W - L - R) + "\" height=\"" +
       number(H - B - T) + "\" fill=\"#fafafa\" stroke=\"#ccc\"/>";
  for (double d = lo; d <= hi * 1.0001; d *= 10) {  // decade gridlines
    const std::string y = number(y_of(d));
    s += "<line x1=\"" + number(L) + "\" x2=\"" + number(W - R) + "\" y1=\"" + y + "\" y2=\"" + y +
         "\" stroke=\"#eee\"/><text x=\"" + number(L - 6) + "\" y=\"" + y +
         "\" font-size=\"10\" text-anchor=\"end\" dominant-baseline=\"middle\">" + number(d) + "</text>";
  }
  s += "<text x=\"" + number(L - 6) + "\" y=\"" + number(H - B) +
       "\" font-size=\"10\" text-anchor=\"end\" dominant-baseline=\"middle\">0</text>";
  if (j.threshold > 0) {
    const std::string y = number(y_of(j.threshold));
    s += "<line x1=\"" + number(L) + "\" x2=\"" + number(W - R) + "\" y1=\"" + y + "\" y2=\"" + y +
         "\" stroke=\"#c62828\" stroke-dasharray=\"6 4\"/><text x=\"" + number(W - R - 4) + "\" y=\"" + y +
         "\" dy=\"-4\" font-size=\"10\" text-anchor=\"end\" fill=\"#c62828\">threshold " + number(j.threshold) +
         "</text>";
  }
  // Past the static table's size a point per entry would be a million SVG elements: the line then
  // goes through each pixel column's lowest and highest error, and only diverging entries (the
  // first kStaticTableRows of them) get their dot.
  const bool reduced = j.verdicts.size() > kStaticTableRows;
  std::string path;
  if (!reduced) {
    for (std::size_t i = 0; i < j.verdicts.size(); ++i) {
      const EntryVerdict& v = j.verdicts[i];
      path += (i ? " L" : "M") + number(x_of(i)) + " " + number(y_of(v.output_error));
    }
  } else {
    for (std::size_t i = 0; i < j.verdicts.size();) {
      const double x = std::floor(x_of(i));
      double top = H, bottom = 0;
      for (; i < j.verdicts.size() && std::floor(x_of(i)) == x; ++i) {
        top = std::min(top, y_of(j.verdicts[i].output_error));
        bottom = std::max(bottom, y_of(j.verdicts[i].output_error));
      }
      path += (path.empty() ? "M" : " L") + number(x) + " " + number(bottom) + " L" + number(x) + " " + number(top);
    }
  }
  if (!path.empty()) s += "<path d=\"" + path + "\" fill=\"none\" stroke=\"#90a4ae\"/>";
  std::size_t dots = 0;
  for (std::size_t i = 0; i < j.verdicts.size(); ++i) {
    const EntryVerdict& v = j.verdicts[i];
    if (reduced && &v != j.source && (!v.outputs_diverge || ++dots > kStaticTableRows)) continue;
    const char* fill = v.source ? "#c62828" : v.outputs_diverge ? "#ef6c00" : "#2e7d32";
    s += "<circle cx=\"" + number(x_of(i)) + "\" cy=\"" + number(y_of(v.output_error)) + "\" r=\"2.5\" fill=\"" + fill +
         "\"><title>" + escape(v.pair->target->name) + ": " + number(v.output_error) + "</title></circle>";
    if (&v == j.source) {
      s += "<circle cx=\"" + number(x_of(i)) + "\" cy=\"" + number(y_of(v.output_error)) +
           "\" r=\"7\" fill=\"none\" stroke=\"#c62828\" stroke-width=\"2\"/><text x=\"" + number(x_of(i)) + "\" y=\"" +
           number(std::max(T + 12, y_of(v.output_error) - 12)) +
           "\" font-size=\"11\" fill=\"#c62828\" text-anchor=\"middle\">" + escape(v.pair->target->name) + "</text>";
    }
  }
  s += "<text x=\"" + number((L + W - R) / 2) + "\" y=\"" + number(H - 8) +
       "\" font-size=\"11\" text-anchor=\"middle\">paired entries in execution order (forward, then backward)" +
       (reduced ? "; dots on diverging entries only" : "") + "</text>";
  return s + "</svg>";
}

// The target's module tree from construct.json, each module coloured by its verdict.
inline std::string module_tree(const Dump& t, const Judgement& j) {
  // Hashed lookups by names that outlive them (a million-entry tree of strings was slow). The tree's
  // nodes are modules and their containers: only those are indexed (indexing every entry of a
  // million cost a second and 100 MB).
  std::unordered_map<std::string_view, const EntryVerdict*> verdict_of;
  for (const EntryVerdict& v : j.verdicts)
    if (v.pair->target->is_module()) verdict_of[v.pair->target->name] = &v;
  // Every name is a view of text that outlives the tree: the rows' (entries) or t.parents' (modules
  // known from construct.json only).
  std::map<std::string_view, std::vector<std::string_view>> children;
  std::vector<std::string_view> roots;
  for (const Entry& e : j.target_entries) {
    if (!e.is_module()) continue;
    const auto p = t.parents.find(e.name);
    if (p == t.parents.end())
      roots.push_back(e.name);
    else
      children[p->second].push_back(e.name);
  }
  // Parents with no entry of their own (a container no guard marks) hang under their own parent
  // from construct.json, or are roots.
  std::vector<std::string_view> pending;
  for (const auto& kv : children) pending.push_back(kv.first);
  std::set<std::string_view> placed;
  // Which of the parents, and of theirs up the tree, are entries: the few names looked up in one
  // scan of the entries (a scan per parent was quadratic in the dump's size, a set of every entry
  // name large).
  std::unordered_set<std::string_view> entry_names;
  {
    std::unordered_set<std::string_view> candidates;
    for (std::string_view up : pending)
      while (candidates.insert(up).second) {
        const auto p = t.parents.find(up);
        if (p == t.parents.end()) break;
        up = p->second;
      }
    if (!candidates.empty())
      for (const Entry& e : j.target_entries)
        if (candidates.count(e.name)) entry_names.insert(e.name);
  }
  if (!entry_names.empty())  // parents that are entries but not modules (an odd dump) are nodes too
    for (const EntryVerdict& v : j.verdicts)
      if (!v.pair->target->is_module() && entry_names.count(v.pair->target->name))
        verdict_of[v.pair->target->name] = &v;
  while (!pending.empty()) {
    const std::string_view parent = pending.back();
    pending.pop_back();
    const bool known = entry_names.count(parent) > 0;
    if (known || !placed.insert(parent).second) continue;
    const auto up = t.parents.find(parent);
    if (up == t.parents.end()) {
      roots.push_back(parent);
    } else {
      children[up->second].push_back(parent);
      pending.push_back(up->second);
    }
  }
  // Execution order: a node comes where the first entry under it does.
  // (Every node is a module entry, a container of them, or an entry that is a parent: only those are
  // looked up.)
  std::unordered_map<std::string_view, std::size_t> first;
  for (std::size_t i = 0; i < j.target_entries.size(); ++i) {
    const Entry& e = j.target_entries[i];
    if (e.is_module() || entry_names.count(e.name)) first.emplace(e.name, i);
  }
  const auto first_of = [&](const auto& self, std::string_view name, int depth) -> std::size_t {
    const auto f = first.find(name);
    if (f != first.end() || depth >= 64) return f != first.end() ? f->second : j.target_entries.size();
    std::size_t m = j.target_entries.size();
    const auto k = children.find(name);
    if (k != children.end())
      for (const std::string_view c : k->second) m = std::min(m, self(self, c, depth + 1));
    first.emplace(name, m);
    return m;
  };
  // Each name's place found once, then a stable sort by it (a comparison looking both up cost seconds
  // for a hundred thousand modules).
  std::vector<std::pair<std::size_t, std::string_view>> keyed;
  const auto sort_by_first = [&](std::vector<std::string_view>& names) {
    keyed.clear();
    for (const std::string_view n : names) keyed.emplace_back(first_of(first_of, n, 0), n);
    std::stable_sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (std::size_t i = 0; i < names.size(); ++i) names[i] = keyed[i].second;
  };
  for (auto& kv : children) sort_by_first(kv.second);
  sort_by_first(roots);
  std::string s;
  // A tree of more nodes than the static table's rows is drawn up to that many (in tree order): a
  // browser lays out a hundred thousand nested lists for seconds; the table has every entry.
  std::size_t drawn = 0, skipped = 0;
  const auto node = [&](const auto& self, std::string_view name, int depth) -> void {
    if (drawn >= kStaticTableRows) {
      ++skipped;
      const auto k = children.find(name);
      if (k != children.end() && depth < 64)
        for (const std::string_view c : k->second) self(self, c, depth + 1);
      return;
    }
    ++drawn;
    const auto v = verdict_of.find(name);
    const char* cls = v == verdict_of.end() ? "unpaired" : verdict_class(*v->second);
    s += "<li><span class=\"" + std::string(cls) + "\">" + escape(name) + "</span>";
    if (v != verdict_of.end())
      s +=
          " <span class=\"meta\">" + std::string(cls) + ", output error " + number(v->second->output_error) + "</span>";
    const auto k = children.find(name);
    if (k != children.end() && depth < 64) {
      s += "<ul class=\"tree\">";
      for (const std::string_view c : k->second) self(self, c, depth + 1);
      s += "</ul>";
    }
    s += "</li>";
  };
  for (const std::string_view r : roots) node(node, r, 0);
  if (skipped)
    s += "<li class=\"meta\">... and " + std::to_string(skipped) +
         " more modules, not drawn (the table below has every paired entry)</li>";
  return s.empty() ? "<p class=\"meta\">No module entries.</p>" : "<ul class=\"tree\">" + s + "</ul>";
}

inline std::string frames(const nlohmann::ordered_json& stack) {
  if (!stack.is_array() || stack.empty()) return "<p class=\"meta\">No stack recorded (stack.json).</p>";
  std::string s = "<ol>";
  for (const auto& f : stack)
    s += "<li><code>" + escape(f.is_string() ? f.get<std::string>() : f.dump()) + "</code></li>";
  return s + "</ol>";
}

}  // namespace html

// The whole page. `report` is first_divergence_json(t, b, j), so the page and the JSON agree.
inline std::string html_report(const Dump& t, const Dump& b, const Judgement& j, const nlohmann::ordered_json& report) {
  using html::escape;
  std::string s = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>torchprobe compare: " +
                  escape(t.file.string()) + " vs " + escape(b.file.string()) + "</title><style>" + html::kStyle +
                  "</style></head><body>\n";
  s += "<h1>torchprobe compare</h1><p class=\"meta\">target <code>" + escape(t.file.string()) +
       "</code><br>bench <code>" + escape(b.file.string()) + "</code><br>mode <b>" + judge_mode_name(j.mode) +
       "</b>, threshold " + html::number(j.threshold) + " (" + escape(report.value("unit", "")) + ")</p>\n";
  const EntryVerdict* answer = j.source ? j.source : j.first_diverging;
  s += std::string("<div id=\"answer\" class=\"answer") + (j.diverged() ? "" : " clean") + "\">";
  if (answer) {
    s += std::string("<p><b>") + (j.source ? "First divergence (source)" : "First diverging entry (no clean source)") +
         ": <span id=\"source-name\">" + escape(answer->pair->target->name) + "</span></b></p><p>matched by " +
         escape(answer->pair->method) + ", input error " + html::number(answer->input_error) + ", output error " +
         html::number(answer->output_error) + " (worst output row <code>" + escape(answer->worst_output) + "</code>)";
    const auto& fd = report[j.source ? "first_divergence" : "first_diverging_entry"];
    if (fd.is_object() && fd.value("innermost_op", "") != answer->pair->target->name)
      s += "; innermost diverging op <code>" + escape(fd.value("innermost_op", "")) + "</code>";
    if (fd.is_object() && fd.contains("module_chain") && !fd["module_chain"].empty()) {
      std::string chain;
      for (const auto& m : fd["module_chain"])
        chain += (chain.empty() ? "" : " &larr; ") + escape(m.get<std::string>());
      s += "; inside " + chain;
    }
    s += "</p>";
  } else {
    s += std::string("<p><b>") + (j.diverged() ? "Only one side overflows" : "No divergence") +
         "</b>: " + escape(j.summary_line()) + "</p>";
  }
  for (const char* side : {"target", "bench"}) {
    const auto& o = report["first_overflow"][side];
    if (o.is_object())
      s += std::string("<p>First overflow (") + side + "): <code>" + escape(o.value("entry", "")) +
           "</code>, paired with <code>" + escape(o.value("paired_with", "")) + "</code> (" +
           escape(o.value("match", "")) + ")</p>";
  }
  s += "<p class=\"meta\">" + escape(j.summary_line()) + "</p></div>\n";
  s += html::blame_section(report);
  s += "<h2>Output error per entry</h2>" + html::error_chart(j) + "\n";
  s += "<h2>Module tree (target)</h2>" + html::module_tree(t, j) + "\n";
  s += "<h2>Stack of the " + std::string(j.source ? "source" : "first diverging entry") + "</h2>" +
       html::frames(answer ? details::stack_of(t, answer->pair->target->name) : nlohmann::ordered_json()) + "\n";
  bool virtualised = false;
  s.reserve(s.size() + j.verdicts.size() * 100 + (std::size_t{1} << 16));  // the table's data, grown once
  s += "<h2>Paired entries</h2><p class=\"meta\">Click a column to sort.</p>";
  html::append_entry_table(s, j, virtualised);
  s += "\n";
  const auto& un = report["unmatched"];
  s += "<h2>Unmatched</h2><details><summary>" + std::to_string(un["target_only"].size()) + " target-only, " +
       std::to_string(un["bench_only"].size()) + " bench-only</summary><ul>";
  for (const char* side : {"target_only", "bench_only"}) {  // a long list: its start (the JSON has it all)
    std::size_t shown = 0;
    for (const auto& e : un[side]) {
      if (++shown > html::kStaticTableRows) {
        s += std::string("<li>") + side + ": ... and " + std::to_string(un[side].size() - html::kStaticTableRows) +
             " more (first_divergence.json lists them all)</li>";
        break;
      }
      s += std::string("<li>") + side + ": " + escape(e.get<std::string>()) + "</li>";
    }
  }
  s += "</ul></details>\n<script>";
  s += virtualised ? html::kVirtualScript : html::kScript;
  s += "</script>\n</body></html>\n";
  return s;
}

}  // namespace torchprobe::compare
