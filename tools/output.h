// The output formats of the `flashlab` command (output.cpp).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "flashlab/bench.h"

namespace flashlab::cli {

// Exit codes (also in the help texts).
inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;      // a library, CUDA or environment error
inline constexpr int kExitUsage = 2;      // a bad command line
inline constexpr int kExitCheckFail = 3;  // a kernel's result failed its check

// A plain-text table: columns padded to their widest cell, numbers right-aligned. A row
// of a kernel that was not timed shows its leading cells (kernel, shape, mask), then why.
class Table {
 public:
  Table(std::vector<std::string> header, std::vector<bool> right)
      : header_(std::move(header)), right_(std::move(right)) {}
  void add(std::vector<std::string> cells) { rows_.push_back({std::move(cells), ""}); }
  void add_reason(std::vector<std::string> lead, std::string reason) {
    rows_.push_back({std::move(lead), std::move(reason)});
  }
  void add_gap() { rows_.push_back({{}, ""}); }
  void print(FILE* out) const;

 private:
  struct Line {
    std::vector<std::string> cells;
    std::string reason;
  };
  void print_line(FILE* out, const Line& l, const std::vector<size_t>& width) const;

  std::vector<std::string> header_;
  std::vector<bool> right_;
  std::vector<Line> rows_;
};

// The report as a table with its footer (rows from `groups` on start a new block), as one
// JSON object, or as CSV lines.
void print_table(const bench::Report& report, const std::vector<size_t>& groups, bool ladder);
void print_json(const bench::Report& report);
void print_csv(const bench::Report& report);

// kExitError when a row had an error, else kExitCheckFail when one failed its check.
int exit_code_of(const bench::Report& report);

}  // namespace flashlab::cli
