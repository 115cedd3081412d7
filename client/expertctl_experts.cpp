// expertctl's views of the per-expert snapshot: `stats --experts` (a table per layer) and `top`
// (the dashboard in a terminal: ANSI escapes, no curses). Both read Client::experts_json and
// Client::stats, as expert-serve's page does; "recent" is the difference of two snapshots.
#include "client/expertctl_experts.h"

#include <poll.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace expertd::ctl {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Snapshot {
  json experts;
  std::map<std::string, double> metrics;
  Clock::time_point at;
  double metric(const std::string& name) const {
    auto it = metrics.find(name);
    return it == metrics.end() ? 0.0 : it->second;
  }
};

Result<Snapshot> take(client::Client& c) {
  Snapshot s;
  auto e = c.experts_json();
  if (!e) return e.error();
  s.experts = json::parse(*e);
  auto m = c.stats();
  if (!m) return m.error();
  for (const auto& x : *m) s.metrics[x.name] = x.value;
  s.at = Clock::now();
  return s;
}

std::string fmt(const char* f, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

std::string percent(double hits, double looked) {
  return looked > 0 ? fmt("%5.1f%%", 100.0 * hits / looked) : std::string("    -");
}

std::string mib(double bytes) {
  return bytes >= 1024.0 * 1048576.0 ? fmt("%.2f GiB", bytes / (1024.0 * 1048576.0))
                                     : fmt("%.1f MiB", bytes / 1048576.0);
}

uint64_t sum(const json& a, size_t from, size_t to) {
  uint64_t s = 0;
  for (size_t i = from; i < to; ++i) s += a[i].get<uint64_t>();
  return s;
}

// What changed since `prev` (or since start without one), per (layer, expert), layer-major.
std::vector<uint64_t> recent(const Snapshot& now, const Snapshot* prev, const char* key) {
  std::vector<uint64_t> out;
  const auto& L = now.experts["layers"];
  for (size_t l = 0; l < L.size(); ++l) {
    const auto& a = L[l][key];
    for (size_t e = 0; e < a.size(); ++e) {
      uint64_t v = a[e].get<uint64_t>();
      if (prev) {  // a reset-stats between the two: the counters restarted from zero
        const uint64_t was = prev->experts["layers"][l][key][e].get<uint64_t>();
        v = v >= was ? v - was : v;
      }
      out.push_back(v);
    }
  }
  return out;
}

// The what-if rows on one line: "8 MiB 41.2% | 16 MiB 55.0% (now) | ...".
// An engine's speculative drafts, where it reported any: ", 40 drafted, 31 accepted (77.5%)".
std::string drafts_text(const json& e) {
  const uint64_t drafted = e.value("drafted", uint64_t{0}), kept = e.value("accepted", uint64_t{0});
  if (drafted == 0) return "";
  return fmt(", %llu drafted, %llu accepted (%.1f%%)", (unsigned long long)drafted,
             (unsigned long long)kept, 100.0 * double(kept) / double(drafted));
}

std::string what_if_line(const json& j) {
  std::string out;
  const uint64_t now_slots = j["slot_count"].get<uint64_t>();
  for (const auto& r : j["what_if"]) {
    if (!out.empty()) out += " | ";
    out += std::to_string(r["cache_mib"].get<uint64_t>()) + " MiB ";
    out += r["hit_rate"].is_null() ? std::string("-") : percent(r["hit_rate"].get<double>(), 1.0);
    if (r["slots"].get<uint64_t>() == now_slots) out += " (now)";
  }
  if (out.empty()) return "no acquires recorded yet";
  return out + fmt("   (%s replay of the last %llu accesses, %.0f s old)",
                   j["policy"].get<std::string>().c_str(),
                   (unsigned long long)j["what_if_accesses"].get<uint64_t>(),
                   j["what_if_age_s"].get<double>());
}

}  // namespace

int cmd_experts_summary(client::Client& c) {
  auto e = c.experts_json();
  if (!e) {
    std::fprintf(stderr, "expertctl: error: %s\n", e.error().message.c_str());
    return 1;
  }
  const json j = json::parse(*e);
  const uint32_t E = j["n_expert"].get<uint32_t>();
  std::printf("%zu MoE layers x %u experts; %s slots: %u x %llu KiB; policy %s\n",
              j["layers"].size(), E, j["tiers"].get<std::string>().c_str(),
              j["slot_count"].get<uint32_t>(),
              (unsigned long long)(j["slot_bytes"].get<uint64_t>() >> 10),
              j["policy"].get<std::string>().c_str());
  std::printf("%5s %5s %9s %12s %12s %8s\n", "layer", "model", "resident", "hits", "misses",
              "hit rate");
  uint64_t hits_total = 0, misses_total = 0;
  for (size_t l = 0; l < j["layers"].size(); ++l) {
    const auto& L = j["layers"][l];
    const std::string r = L["resident"].get<std::string>();
    const auto resident = std::count_if(r.begin(), r.end(), [](char ch) { return ch != '.'; });
    const uint64_t h = sum(L["hits"], 0, E), m = sum(L["misses"], 0, E);
    hits_total += h, misses_total += m;
    std::printf("%5zu %5u %4ld/%-4u %12llu %12llu %8s\n", l, L["model_layer"].get<uint32_t>(),
                long(resident), E, (unsigned long long)h, (unsigned long long)m,
                percent(double(h), double(h + m)).c_str());
  }
  std::printf("%5s %5s %9s %12llu %12llu %8s\n", "all", "", "", (unsigned long long)hits_total,
              (unsigned long long)misses_total,
              percent(double(hits_total), double(hits_total + misses_total)).c_str());
  const auto& d = j["drive"];
  std::printf("drive     %s read", mib(d["read_bytes"].get<double>()).c_str());
  if (!d["read_mib_s_measured"].is_null())
    std::printf(", %.0f MiB/s measured while reading", d["read_mib_s_measured"].get<double>());
  std::printf("\nwhat if   %s\n", what_if_line(j).c_str());
  std::printf("connected");
  for (const auto& en : j["engines"])
    std::printf("  %s (%s, pid %d, %llu acquires%s)", en["name"].get<std::string>().c_str(),
                en["kind"].get<std::string>().c_str(), en["pid"].get<int>(),
                (unsigned long long)en["acquires"].get<uint64_t>(), drafts_text(en).c_str());
  std::printf("\n");
  return 0;
}

namespace {

volatile std::sig_atomic_t g_stop = 0;  // a signal handler's flag: the one static it needs

// The terminal while top draws: raw keys (q), the alternate screen, no cursor; put back as it
// was on every way out (q, Ctrl-C, SIGTERM, an error).
class Screen {
 public:
  Screen() : tty_(::isatty(1)), keys_(tty_ && ::isatty(0)) {
    const char* nc = std::getenv("NO_COLOR");
    color_ = tty_ && !(nc && *nc);
  }
  ~Screen() { leave(); }
  bool tty() const { return tty_; }
  bool color() const { return color_; }
  void enter() {
    if (!tty_) return;
    if (keys_ && ::tcgetattr(0, &saved_) == 0) {
      termios raw = saved_;
      raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);  // ISIG stays: Ctrl-C is SIGINT
      raw.c_cc[VMIN] = 0;
      raw.c_cc[VTIME] = 0;
      raw_ = ::tcsetattr(0, TCSANOW, &raw) == 0;
    }
    std::fputs("\033[?1049h\033[?25l", stdout);
    entered_ = true;
  }
  void leave() {
    if (raw_) ::tcsetattr(0, TCSANOW, &saved_);
    raw_ = false;
    if (entered_) std::fputs("\033[?25h\033[?1049l", stdout);
    entered_ = false;
    std::fflush(stdout);
  }
  // Columns and rows; a pipe gets $COLUMNS (or 100) and no limit on rows.
  std::pair<int, int> size() const {
    winsize w{};
    if (tty_ && ::ioctl(1, TIOCGWINSZ, &w) == 0 && w.ws_col > 0) return {w.ws_col, w.ws_row};
    const char* cols = std::getenv("COLUMNS");
    return {cols && std::atoi(cols) > 20 ? std::atoi(cols) : 100, 1 << 20};
  }
  // Waits up to `s` seconds for a key; true when it was q (or Q).
  bool wait_quit(double s) {
    const auto until = Clock::now() + std::chrono::duration<double>(s);
    while (!g_stop) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
      if (left.count() <= 0) return false;
      pollfd p{0, POLLIN, 0};
      const int n = ::poll(&p, keys_ ? 1 : 0, static_cast<int>(left.count()));
      if (n > 0 && (p.revents & POLLIN)) {
        char ch[16];
        const ssize_t got = ::read(0, ch, sizeof ch);
        for (ssize_t i = 0; i < got; ++i)
          if (ch[i] == 'q' || ch[i] == 'Q') return true;
      }
    }
    return true;
  }

 private:
  bool tty_, keys_, color_ = false, raw_ = false, entered_ = false;
  termios saved_{};
};

// 256-colour heat: hits in the interval relative to the frame's busiest cell, on a log scale.
const char* heat_color(int level) {
  static const char* kLevels[] = {"\033[38;5;242m", "\033[38;5;33m",  "\033[38;5;45m",
                                  "\033[38;5;220m", "\033[38;5;208m", "\033[1;38;5;196m"};
  return kLevels[std::clamp(level, 0, 5)];
}

// One cell of the grid: a layer group x an expert group. One expert: its residency letter; a
// group: '.' none resident, '#' all, else the resident tenths as a digit (1..9).
char cell_glyph(const json& layers, size_t l0, size_t l1, size_t e0, size_t e1) {
  size_t n = 0, resident = 0, loading = 0;
  char only = 0;
  for (size_t l = l0; l < l1; ++l) {
    const std::string& r = layers[l]["resident"].get_ref<const std::string&>();
    for (size_t e = e0; e < e1; ++e, ++n) {
      resident += r[e] == 'V' || r[e] == 'H';
      loading += r[e] == 'L';
      only = r[e];
    }
  }
  if (n == 1) return only;
  if (resident == 0) return loading ? 'L' : '.';
  if (resident == n) return '#';
  return static_cast<char>('0' + std::clamp<size_t>((resident * 10) / n, 1, 9));
}

std::vector<std::string> header(const Snapshot& now, const Snapshot* prev, double dt) {
  const json& j = now.experts;
  auto d = [&](const char* m) { return now.metric(m) - (prev ? prev->metric(m) : 0.0); };
  const double hits = d("cache_hits"), misses = d("cache_misses");
  const double all_hits = now.metric("cache_hits"),
               all_looked = all_hits + now.metric("cache_misses");
  std::vector<std::string> out;
  out.push_back(fmt("expertd top  %s slots %llu/%u used x %llu KiB, policy %s   (q quits)",
                    j["tiers"].get<std::string>().c_str(),
                    (unsigned long long)now.metric("slots_used"), j["slot_count"].get<uint32_t>(),
                    (unsigned long long)(j["slot_bytes"].get<uint64_t>() >> 10),
                    j["policy"].get<std::string>().c_str()));
  const std::string span = prev ? fmt("last %.1f s", dt) : std::string("since start");
  out.push_back(fmt("cache    hit rate %s (%s), %s overall   ",
                    percent(hits, hits + misses).c_str(), span.c_str(),
                    percent(all_hits, all_looked).c_str()) +
                (prev ? fmt("acquires/s %.0f", d("acquires") / dt)
                      : fmt("acquires %.0f", now.metric("acquires"))));
  const auto& drive = j["drive"];
  std::string dl = prev ? fmt("drive    read %.1f MiB/s", d("pack_read_bytes") / 1048576.0 / dt)
                        : "drive    read " + mib(drive["read_bytes"].get<double>()) + " so far";
  if (!drive["read_mib_s_measured"].is_null()) {
    const double bw = drive["read_mib_s_measured"].get<double>();
    dl += fmt(" of %.0f MiB/s measured", bw);
    if (prev && bw > 0) dl += fmt(" (%.0f%%)", 100.0 * d("pack_read_bytes") / 1048576.0 / dt / bw);
  }
  out.push_back(dl);
  out.push_back(fmt("latency  acquire p50 %.0f us p99 %.0f us   read p50 %.0f us p99 %.0f us",
                    now.metric("acquire_latency_us_p50"), now.metric("acquire_latency_us_p99"),
                    now.metric("read_latency_us_p50"), now.metric("read_latency_us_p99")));
  std::string en;
  size_t engines = 0;
  for (const auto& e : j["engines"]) {
    if (e["kind"] != "engine") continue;
    ++engines;
    en += fmt("  %s (pid %d, %llu acquires%s)", e["name"].get<std::string>().c_str(),
              e["pid"].get<int>(), (unsigned long long)e["acquires"].get<uint64_t>(),
              drafts_text(e).c_str());
  }
  out.push_back(fmt("engines  %zu", engines) + en);
  out.push_back("what if  " + what_if_line(j));
  return out;
}

// The frame, line by line (no line ending; colour escapes when `color`).
std::vector<std::string> frame(const Snapshot& now, const Snapshot* prev, int cols, int rows,
                               bool color) {
  const double dt = prev ? std::chrono::duration<double>(now.at - prev->at).count() : 0.0;
  std::vector<std::string> out = header(now, prev, dt);
  const json& layers = now.experts["layers"];
  const size_t L = layers.size(), E = now.experts["n_expert"].get<size_t>();
  const std::vector<uint64_t> hits = recent(now, prev, "hits"),
                              misses = recent(now, prev, "misses");
  // Fold: experts per character so a row fits the width, layers per row so the grid fits the
  // height (a pipe is never folded in height: one row per layer).
  const size_t grid_cols = static_cast<size_t>(std::max(8, cols - 24));
  const size_t per_e = (E + grid_cols - 1) / grid_cols;
  const size_t grid_rows =
      static_cast<size_t>(std::max(4, rows - static_cast<int>(out.size()) - 3));
  const size_t per_l = (L + grid_rows - 1) / grid_rows;
  out.push_back(fmt("%7s  experts 0-%zu%s: V vram, H host, L loading, . absent%s%s", "layer", E - 1,
                    per_e > 1 ? fmt(", %zu a char", per_e).c_str() : "",
                    per_e > 1 || per_l > 1 ? ", digit: tenths resident, # all" : "",
                    color ? "; hits grey..red" : ""));
  std::vector<uint64_t> cell_hits;
  uint64_t hottest = 0;
  for (size_t l = 0; l < L; l += per_l)
    for (size_t e = 0; e < E; e += per_e) {
      uint64_t h = 0;
      for (size_t ll = l; ll < std::min(L, l + per_l); ++ll)
        for (size_t ee = e; ee < std::min(E, e + per_e); ++ee) h += hits[ll * E + ee];
      cell_hits.push_back(h);
      hottest = std::max(hottest, h);
    }
  size_t cell = 0;
  for (size_t l = 0; l < L; l += per_l) {
    const size_t l1 = std::min(L, l + per_l);
    std::string label = std::to_string(layers[l]["model_layer"].get<uint32_t>());
    if (l1 - l > 1) label += "-" + std::to_string(layers[l1 - 1]["model_layer"].get<uint32_t>());
    std::string row = fmt("%7s |", label.c_str());
    uint64_t h = 0, m = 0;
    int shown = -1;  // the colour in force: an escape only where it changes
    for (size_t e = 0; e < E; e += per_e, ++cell) {
      if (color) {
        const uint64_t ch = cell_hits[cell];
        const int level =
            ch == 0 || hottest == 0
                ? 0
                : 1 + static_cast<int>(4.0 * std::log1p(double(ch)) / std::log1p(double(hottest)));
        if (level != shown) row += heat_color(level);
        shown = level;
      }
      row += cell_glyph(layers, l, l1, e, std::min(E, e + per_e));
    }
    for (size_t ll = l; ll < l1; ++ll)
      for (size_t e = 0; e < E; ++e) h += hits[ll * E + e], m += misses[ll * E + e];
    if (color) row += "\033[0m";
    row += fmt("| %7llu miss %s", (unsigned long long)m, percent(double(h), double(h + m)).c_str());
    out.push_back(std::move(row));
  }
  return out;
}

void on_signal(int) {
  g_stop = 1;
}

}  // namespace

int cmd_top(client::Client& c, double watch_s) {
  if (watch_s <= 0) watch_s = 1.0;
  Screen screen;
  struct sigaction sa {};
  sa.sa_handler = on_signal;  // no SA_RESTART: the wait wakes at once
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  screen.enter();
  Snapshot prev;
  bool have_prev = false;
  while (!g_stop) {
    auto snap = take(c);
    if (!snap) {
      screen.leave();
      std::fprintf(stderr, "expertctl: error: %s\n", snap.error().message.c_str());
      return 1;
    }
    const auto [cols, rows] = screen.size();
    const auto lines = frame(*snap, have_prev ? &prev : nullptr, cols, rows, screen.color());
    std::string text = screen.tty() ? "\033[H" : "";
    for (const auto& line : lines) text += line + (screen.tty() ? "\033[K\n" : "\n");
    if (screen.tty()) text += "\033[J";
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
    if (!screen.tty()) return 0;  // a pipe or a file: one frame
    prev = std::move(*snap);
    have_prev = true;
    if (screen.wait_quit(watch_s)) break;
  }
  screen.leave();
  return 0;
}

}  // namespace expertd::ctl
