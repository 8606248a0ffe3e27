#pragma once
// report.html's table of paired entries. Up to kStaticTableRows rows it is plain HTML (sortable by
// a script, readable without one). Above, a million <tr> would keep a browser busy for minutes, so
// the rows go into the page as data (a JSON array in a <script type="application/json">) and a
// script renders only the rows in view of a scrolled box, again on each scroll; sorting sorts the
// data. Rows in the data: [target, bench (0: same name as the target), match (index into
// "methods"), input error, output error, verdict (0 pass, 1 warning, 2 error)], errors as the sort
// keys of the static table (inf 1e308, nan -1). Once drawn, <body> gets data-ready-ms: the
// milliseconds from the start of the page's navigation (tools/report_open_time.py reads it).
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "torchprobe/analysis/compare/first_divergence.hpp"
#include "torchprobe/analysis/compare/html_text.hpp"
#include "torchprobe/io/python_csv.hpp"

namespace torchprobe::compare::html {

constexpr std::size_t kStaticTableRows = 5000;

inline std::string number(double x) { return io::python_float_format(x, "%.3g"); }

// A sort key the table script can compare as a number: inf sorts last, nan below everything;
// others as printf's %.17g. Appended in place (the virtualised table writes a million).
inline void append_sort_key(std::string& out, double x) {
  if (std::isnan(x)) {
    out += "-1";
  } else if (std::isinf(x)) {
    out += "1e308";
  } else {
    char buf[32];
    out.append(buf, static_cast<std::size_t>(
                        std::to_chars(buf, buf + sizeof buf, x, std::chars_format::general, 17).ptr - buf));
  }
}
inline std::string sort_key(double x) {
  std::string s;
  append_sort_key(s, x);
  return s;
}

// The pair's bench entries as the table shows them, " + " between a template's sequence.
inline std::string bench_names(const EntryPair& p) {
  std::string out;
  for (const Entry* e : p.bench) out.append(out.empty() ? "" : " + ").append(e->name);
  return out;
}

// pass: within the threshold; warning: outputs diverge, carried in by diverging inputs; error:
// outputs diverge here (the entry is a source).
inline const char* verdict_class(const EntryVerdict& v) {
  if (v.source) return "error";
  if (v.outputs_diverge || v.inputs_diverge) return "warning";
  return "pass";
}

// A JSON string literal that cannot end its <script>: '<' is written \u003c.
inline void json_string(std::string& out, std::string_view s) {
  out += '"';
  std::size_t plain = 0;  // plain characters are appended a run at a time
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const auto u = static_cast<unsigned char>(c);
    if (c != '"' && c != '\\' && u >= 0x20 && c != '<') continue;
    out.append(s.data() + plain, i - plain);
    plain = i + 1;
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out += buf;
    }
  }
  out.append(s.data() + plain, s.size() - plain);
  out += '"';
}

// %.3g of C, in the page's script: the static table's number().
inline const char* kVirtualScript = R"(
(function(){
  var data=JSON.parse(document.getElementById('entries-data').textContent);
  var rows=data.rows,n=rows.length,order=new Array(n),i;
  for(i=0;i<n;i++)order[i]=i;
  var view=document.getElementById('entries-view'),body=document.getElementById('entries').tBodies[0];
  var cls=['pass','warning','error'],H=20,first=-1,last=-1;
  function g3(x){
    if(x===-1)return 'nan';if(x>=1e308)return 'inf';if(x===0)return '0';
    var s=x.toExponential(2),e=parseInt(s.slice(s.indexOf('e')+1),10),t;
    if(e<-4||e>=3){t=s.slice(0,s.indexOf('e'));if(t.indexOf('.')>=0)t=t.replace(/0+$/,'').replace(/\.$/,'');
      return t+'e'+(e<0?'-':'+')+(Math.abs(e)<10?'0':'')+Math.abs(e);}
    t=x.toFixed(2-e);if(t.indexOf('.')>=0)t=t.replace(/0+$/,'').replace(/\.$/,'');return t;}
  function td(text,c){var d=document.createElement('td');if(c)d.className=c;d.textContent=text;return d;}
  function spacer(h){var r=document.createElement('tr');r.className='spacer';var d=document.createElement('td');
    d.colSpan=7;d.style.height=h+'px';d.style.padding='0';d.style.border='0';r.appendChild(d);return r;}
  function render(){
    var a=Math.max(0,Math.floor(view.scrollTop/H)-20),b=Math.min(n,a+Math.ceil(view.clientHeight/H)+40);
    if(a===first&&b===last)return;first=a;last=b;
    var f=document.createDocumentFragment();f.appendChild(spacer(a*H));
    for(var k=a;k<b;k++){var x=order[k],r=rows[x],tr=document.createElement('tr');
      if(x===data.source)tr.className='source';
      tr.appendChild(td(String(x),'num'));tr.appendChild(td(r[0]));tr.appendChild(td(r[1]===0?r[0]:r[1]));
      tr.appendChild(td(data.methods[r[2]]));tr.appendChild(td(g3(r[3]),'num'));tr.appendChild(td(g3(r[4]),'num'));
      tr.appendChild(td(cls[r[5]],cls[r[5]]));f.appendChild(tr);}
    f.appendChild(spacer((n-b)*H));body.textContent='';body.appendChild(f);}
  view.addEventListener('scroll',function(){window.requestAnimationFrame(render);});
  var heads=document.getElementById('entries').tHead.rows[0].cells;
  var key=[function(x){return x;},function(x){return rows[x][0];},function(x){var r=rows[x];return r[1]===0?r[0]:r[1];},
    function(x){return data.methods[rows[x][2]];},function(x){return rows[x][3];},function(x){return rows[x][4];},
    function(x){return rows[x][5];}];
  for(var c=0;c<heads.length;c++){(function(col){heads[col].addEventListener('click',function(){
    var up=heads[col].getAttribute('data-up')!=='1';heads[col].setAttribute('data-up',up?'1':'0');var k=key[col];
    order.sort(function(x,y){var p=k(x),q=k(y),d=typeof p==='string'?p.localeCompare(q):p-q;return (up?d:-d)||x-y;});
    first=last=-1;render();});})(c);}
  render();
  document.body.setAttribute('data-ready-ms',String(Math.round(performance.now())));
  document.body.setAttribute('data-ready','1');
})();
)";

inline std::string table_head() {
  return "<table id=\"entries\"><thead><tr><th>#</th><th>target entry</th><th>bench entries</th><th>match</th>"
         "<th>input error</th><th>output error</th><th>verdict</th></tr></thead><tbody>";
}

// The rows as data, for the virtualised table.
// (Appended to `s` in place, its numbers written without a string each: a million rows are 60 MB,
// and strings made and copied per row and per part were seconds and hundreds of megabytes.)
inline void append_entries_data(std::string& s, const Judgement& j) {
  std::vector<std::string_view> methods;
  s += "{\"rows\":[";
  char num[24];
  for (std::size_t i = 0; i < j.verdicts.size(); ++i) {
    const EntryVerdict& v = j.verdicts[i];
    std::size_t m = 0;
    while (m < methods.size() && methods[m] != v.pair->method) ++m;
    if (m == methods.size()) methods.push_back(v.pair->method);
    s += i ? ",[" : "[";
    json_string(s, v.pair->target->name);
    s += ',';
    const auto& bench = v.pair->bench;  // 0: the target's name (one bench entry of that name: no string made)
    if (bench.size() == 1 && bench.front()->name == v.pair->target->name) {
      s += '0';
    } else {
      const std::string joined = bench_names(*v.pair);
      if (joined == v.pair->target->name)
        s += '0';
      else
        json_string(s, joined);
    }
    s += ',';
    s.append(num, static_cast<std::size_t>(std::to_chars(num, num + sizeof num, m).ptr - num));
    s += ',';
    append_sort_key(s, v.input_error);
    s += ',';
    append_sort_key(s, v.output_error);
    const std::string_view c = verdict_class(v);
    s += c == "error" ? ",2]" : c == "warning" ? ",1]" : ",0]";
  }
  s += "],\"methods\":[";
  for (std::size_t m = 0; m < methods.size(); ++m) {
    if (m) s += ',';
    json_string(s, methods[m]);
  }
  const long source = j.source ? static_cast<long>(j.source - j.verdicts.data()) : -1L;
  s += "],\"source\":" + std::to_string(source) + "}";
}
inline std::string entries_data(const Judgement& j) {
  std::string s;
  append_entries_data(s, j);
  return s;
}

// The table, and whether it is the virtualised one (then the page needs kVirtualScript, not kScript).
inline void append_entry_table(std::string& out, const Judgement& j, bool& virtualised) {
  virtualised = j.verdicts.size() > kStaticTableRows;
  if (virtualised) {
    out += "<p class=\"meta\">" + std::to_string(j.verdicts.size()) +
           " rows: only those in view are drawn (scroll the box); the page needs scripts for them.</p>"
           "<style>#entries-view td{height:15px;white-space:nowrap}</style>"
           "<div id=\"entries-view\" style=\"max-height:70vh;overflow:auto\">" +
           table_head() + "</tbody></table></div><script type=\"application/json\" id=\"entries-data\">";
    append_entries_data(out, j);
    out += "</script>";
    return;
  }
  std::string& s = out;
  s += table_head();
  for (std::size_t i = 0; i < j.verdicts.size(); ++i) {
    const EntryVerdict& v = j.verdicts[i];
    const std::string bench = bench_names(*v.pair);
    const char* cls = verdict_class(v);
    s += std::string("<tr") + (&v == j.source ? " class=\"source\"" : "") + "><td class=\"num\" data-key=\"" +
         std::to_string(i) + "\">" + std::to_string(i) + "</td><td>" + escape(v.pair->target->name) + "</td><td>" +
         escape(bench) + "</td><td>" + escape(v.pair->method) + "</td><td class=\"num\" data-key=\"" +
         sort_key(v.input_error) + "\">" + number(v.input_error) + "</td><td class=\"num\" data-key=\"" +
         sort_key(v.output_error) + "\">" + number(v.output_error) + "</td><td class=\"" + cls + "\">" + cls +
         "</td></tr>";
  }
  s += "</tbody></table>";
}
inline std::string entry_table(const Judgement& j, bool& virtualised) {
  std::string s;
  append_entry_table(s, j, virtualised);
  return s;
}

}  // namespace torchprobe::compare::html
