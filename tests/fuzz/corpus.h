// The regression corpus: fixed calls, each a failure class found by fuzzing, run at the
// start of every fuzz run on every kernel of the device that has the pass.
#pragma once

#include <string>
#include <vector>

#include "call.h"

namespace flashlab::fuzz {

struct CorpusCase {
  int number;        // stable: `flashlab_fuzz --corpus N` replays case N
  std::string what;  // the rule it checks
  Call call;
};

std::vector<CorpusCase> corpus(const Env& env);

}  // namespace flashlab::fuzz
