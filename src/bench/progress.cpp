// Progress on stderr (bench.h): a line for a call longer than kProgressDelay, shown by a
// watcher thread while the call runs, and a counter for a sweep.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

#include "flashlab/bench.h"

namespace flashlab::bench {
namespace {

using Clock = std::chrono::steady_clock;

// A call shows its line once it has run this long; the watcher looks this often; when
// stderr is not a terminal (a log file) a still-running call is reported again this often.
constexpr std::chrono::milliseconds kProgressDelay{3'000};
constexpr std::chrono::milliseconds kProgressTick{250};
constexpr std::chrono::seconds kQuietRepeat{30};
constexpr int kBarWidth = 30;
constexpr size_t kLineWidth = 150;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

struct Progress::State {
  bool enabled = false;
  bool tty = false;
  int total = 0, done = 0, last_tenth = -1;
  Clock::time_point started = Clock::now();

  std::mutex mutex;
  std::condition_variable wake;
  std::thread watcher;
  bool quit = false, active = false, shown = false;
  std::string what;
  Clock::time_point since, last_shown;

  void show_locked() {
    if (tty)
      std::fprintf(stderr, "\r\033[K  %s (%.1f s)...", what.c_str(), seconds_since(since));
    else
      std::fprintf(stderr, "  %s (%.1f s)...\n", what.c_str(), seconds_since(since));
    std::fflush(stderr);
    shown = true;
    last_shown = Clock::now();
  }

  void watch() {
    std::unique_lock lock(mutex);
    while (!quit) {
      wake.wait_for(lock, kProgressTick);
      if (quit || !active) continue;
      const auto now = Clock::now();
      if (now - since < kProgressDelay) continue;
      if (tty || !shown || now - last_shown >= kQuietRepeat) show_locked();
    }
  }
};

Progress::Progress(bool enabled, int total) : state_(std::make_unique<State>()) {
  state_->enabled = enabled;
  state_->tty = isatty(fileno(stderr)) != 0;
  state_->total = total;
}

Progress::~Progress() {
  if (!state_->watcher.joinable()) return;
  {
    std::lock_guard lock(state_->mutex);
    state_->quit = true;
  }
  state_->wake.notify_all();
  state_->watcher.join();
}

void Progress::begin(std::string what) {
  State& s = *state_;
  if (!s.enabled) return;
  std::lock_guard lock(s.mutex);
  if (!s.watcher.joinable()) s.watcher = std::thread([&s] { s.watch(); });
  s.what = std::move(what);
  s.since = Clock::now();
  s.active = true;
  s.shown = false;
  s.wake.notify_all();
}

void Progress::end() {
  State& s = *state_;
  if (!s.enabled) return;
  std::lock_guard lock(s.mutex);
  if (s.shown) {
    if (s.tty) std::fputs("\r\033[K", stderr);
    std::fprintf(stderr, "  %s: %.1f s\n", s.what.c_str(), seconds_since(s.since));
    std::fflush(stderr);
  }
  s.active = false;
  s.shown = false;
}

// "[#########.....................] 12/36    41s  fwd 4x4096x16x128 bf16 causal"; on a
// terminal one line rewritten, otherwise one line per tenth of the sweep.
void Progress::step(std::string_view what) {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  ++s.done;
  if (!s.enabled) return;
  const int total = std::max(s.total, 1);
  const double frac = std::min(1.0, double(s.done) / total);
  const int filled = int(kBarWidth * frac);
  char head[96];
  std::snprintf(head, sizeof head, "[%s%s] %d/%d %5.0fs  ", std::string(size_t(filled), '#').c_str(),
                std::string(size_t(kBarWidth - filled), '.').c_str(), s.done, total,
                seconds_since(s.started));
  std::string line = head + std::string(what);
  if (s.tty) {
    line.resize(kLineWidth, ' ');
    std::fprintf(stderr, "\r%s%s", line.c_str(), s.done >= total ? "\n" : "");
  } else if (int(10 * frac) != s.last_tenth) {
    s.last_tenth = int(10 * frac);
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

}  // namespace flashlab::bench
