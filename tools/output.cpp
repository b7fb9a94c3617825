// The output formats of `flashlab bench` and `flashlab list`: a plain-text table, JSON
// and CSV. Results go to stdout; notes and progress lines go to stderr, so that --json and
// --csv stay machine-readable.
#include "output.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace flashlab::cli {

using bench::Problem;
using bench::Report;
using bench::Row;
using bench::RowStatus;

namespace {

std::string printf_string(const char* fmt, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, x);
  return buf;
}

std::string format_ms(double ms) {
  return printf_string(ms >= 1000 ? "%.0f" : ms >= 100 ? "%.1f" : ms >= 10 ? "%.2f" : "%.3f", ms);
}

// Three significant digits, without exponents: CPU rates read 0.0412, GPU rates 312.
std::string format_rate(double t) {
  return printf_string(t >= 100 ? "%.0f" : t >= 10 ? "%.1f" : t >= 1 ? "%.2f" : t >= 0.1 ? "%.3f" : "%.4f", t);
}

std::string format_err(double e) { return std::isnan(e) ? "-" : printf_string("%.1e", e); }
std::string format_ratio(double r) {
  return std::isnan(r) ? "-" : printf_string(r >= 10 ? "%.1fx" : "%.2fx", r);
}

Table make_table(bool backward, bool ladder, bool decode) {
  std::vector<std::string> h = {"kernel", "shape", "mask", "time ms", "runs", "TFLOP/s", "extra mem"};
  if (decode) h.insert(h.begin() + 6, "GB/s");
  if (backward)
    h.insert(h.end(), {"err dq", "err dk", "err dv"});
  else
    h.insert(h.end(), {"err out", "err lse"});
  h.push_back("vs base");
  if (ladder) h.push_back("vs prev");
  h.push_back("check");
  std::vector<bool> right(h.size(), true);
  right[0] = right[1] = right[2] = false;
  right.back() = false;
  return Table(std::move(h), std::move(right));
}

std::vector<std::string> row_cells(const Row& r, bool ladder, bool decode) {
  std::vector<std::string> c = {r.kernel, bench::shape_string(r.problem), bench::mask_string(r.problem),
                                format_ms(r.time_ms), std::to_string(r.timed_runs), format_rate(r.tflops),
                                bench::format_bytes(r.workspace_bytes)};
  if (decode) c.insert(c.begin() + 6, format_rate(r.gbps()));
  if (r.problem.backward)
    c.insert(c.end(), {format_err(r.err_dq), format_err(r.err_dk), format_err(r.err_dv)});
  else
    c.insert(c.end(), {format_err(r.err_out), format_err(r.err_lse)});
  c.push_back(format_ratio(r.vs_base));
  if (ladder) c.push_back(format_ratio(r.vs_prev));
  c.push_back(r.status == RowStatus::kOk ? "ok" : "-");
  return c;
}

// Machine-readable fields of a row, in output order: (name, JSON value, CSV value).
struct Field {
  std::string name, json, csv;
};

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      out += printf_string("\\u%04x", double(static_cast<unsigned char>(ch)));
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string csv_string(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (const char ch : s) out += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return out + "\"";
}

Field text_field(const std::string& name, const std::string& v) { return {name, json_string(v), csv_string(v)}; }
Field number_field(const std::string& name, double v) {
  if (!std::isfinite(v)) return {name, "null", ""};
  const std::string s = printf_string("%.9g", v);
  return {name, s, s};
}
Field bool_field(const std::string& name, bool v) {
  return {name, v ? "true" : "false", v ? "true" : "false"};
}

std::vector<Field> row_fields(const Row& r) {
  const Problem& p = r.problem;
  return {text_field("kernel", r.kernel),
          text_field("status", bench::to_string(r.status)),
          text_field("reason", r.reason),
          text_field("device", to_string(p.device)),
          text_field("pass", p.backward ? "backward" : p.decode ? "decode" : "forward"),
          number_field("batch", p.batch), number_field("heads_q", p.heads_q),
          number_field("heads_kv", p.heads_kv), number_field("seqlen_q", p.seqlen_q),
          number_field("seqlen_k", p.seqlen_k), number_field("head_dim", p.head_dim),
          number_field("head_dim_v", p.head_dim_v), text_field("dtype", to_string(p.dtype)),
          text_field("mask", bench::mask_string(p)), bool_field("causal", p.causal),
          number_field("window_left", p.window_left), number_field("window_right", p.window_right),
          number_field("softcap", p.softcap), number_field("page_size", p.page_size),
          number_field("seqlen_new", p.seqlen_new), bool_field("rotary", p.rotary),
          number_field("time_ms", r.time_ms),
          number_field("warmup_runs", r.warmup_runs), number_field("timed_runs", r.timed_runs),
          number_field("rounds", double(r.round_ms.size())),
          number_field("flops", r.flops), number_field("tflops", r.tflops),
          number_field("kv_bytes", r.kv_bytes), number_field("gbps", r.gbps()),
          number_field("workspace_bytes", double(r.workspace_bytes)),
          number_field("err_out", r.err_out), number_field("err_lse", r.err_lse),
          number_field("err_dq", r.err_dq), number_field("err_dk", r.err_dk),
          number_field("err_dv", r.err_dv), number_field("vs_base", r.vs_base),
          number_field("vs_prev", r.vs_prev)};
}

}  // namespace

void Table::print(FILE* out) const {
  std::vector<size_t> width(header_.size());
  for (size_t c = 0; c < header_.size(); ++c) width[c] = header_[c].size();
  for (const Line& l : rows_)
    for (size_t c = 0; c < l.cells.size() && c < width.size(); ++c)
      width[c] = std::max(width[c], l.cells[c].size());
  print_line(out, {header_, ""}, width);
  for (const Line& l : rows_) print_line(out, l, width);
}

void Table::print_line(FILE* out, const Line& l, const std::vector<size_t>& width) const {
  for (size_t c = 0; c < l.cells.size(); ++c) {
    const bool last = c + 1 == header_.size() && l.reason.empty();
    const int w = right_[c] || !last ? int(width[c]) : 0;  // no trailing blanks
    std::fprintf(out, "%s", c == 0 ? "" : "  ");
    std::fprintf(out, right_[c] ? "%*s" : "%-*s", w, l.cells[c].c_str());
  }
  if (!l.reason.empty()) std::fprintf(out, "  %s", l.reason.c_str());
  std::fputc('\n', out);
}

void print_table(const Report& report, const std::vector<size_t>& groups, bool ladder) {
  const bool backward = !report.rows.empty() && report.rows.front().problem.backward;
  const bool decode = !report.rows.empty() && report.rows.front().problem.decode;
  Table t = make_table(backward, ladder, decode);
  for (size_t i = 0; i < report.rows.size(); ++i) {
    if (i > 0 && std::find(groups.begin(), groups.end(), i) != groups.end()) t.add_gap();
    const Row& r = report.rows[i];
    if (r.timed()) {
      t.add(row_cells(r, ladder, decode));
      continue;
    }
    std::vector<std::string> lead = {r.kernel, bench::shape_string(r.problem),
                                     bench::mask_string(r.problem)};
    t.add_reason(std::move(lead), std::string(bench::to_string(r.status)) + ": " + r.reason);
  }
  t.print(stdout);
  std::printf("\n");
  std::printf("device: %s\n", report.device.c_str());
  std::printf("check:  %s\n", report.checked.c_str());
  std::printf("timing: %s\n", report.timing.c_str());
  std::printf("inputs: %s\n", report.inputs.c_str());
  std::printf("extra mem = workspace_size(): FlashLab never allocates; the caller provides it\n");
}

void print_json(const Report& report) {
  std::printf("{\n  \"device\": %s,\n  \"check\": %s,\n  \"timing\": %s,\n  \"inputs\": %s,\n  \"rows\": [",
              json_string(report.device).c_str(), json_string(report.checked).c_str(),
              json_string(report.timing).c_str(), json_string(report.inputs).c_str());
  for (size_t i = 0; i < report.rows.size(); ++i) {
    std::printf("%s\n    {", i ? "," : "");
    const std::vector<Field> fields = row_fields(report.rows[i]);
    for (size_t j = 0; j < fields.size(); ++j)
      std::printf("%s\"%s\": %s", j ? ", " : "", fields[j].name.c_str(), fields[j].json.c_str());
    std::printf("}");
  }
  std::printf("\n  ]\n}\n");
}

void print_csv(const Report& report) {
  const std::vector<Field> header = row_fields(Row{});
  for (size_t j = 0; j < header.size(); ++j) std::printf("%s%s", j ? "," : "", header[j].name.c_str());
  std::printf("\n");
  for (const Row& r : report.rows) {
    const std::vector<Field> fields = row_fields(r);
    for (size_t j = 0; j < fields.size(); ++j) std::printf("%s%s", j ? "," : "", fields[j].csv.c_str());
    std::printf("\n");
  }
}

int exit_code_of(const Report& report) {
  bool fail = false;
  for (const Row& r : report.rows) {
    if (r.status == RowStatus::kError) return kExitError;
    fail |= r.status == RowStatus::kFail;
  }
  return fail ? kExitCheckFail : kExitOk;
}

}  // namespace flashlab::cli
