// expertctl: look at and steer a running expertd. A table of verbs with generated help.
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/expert_client.h"
#include "client/expertctl_experts.h"

using namespace expertd;

namespace {

struct Args {
  std::string socket =
      std::getenv("EXPERTD_SOCKET") ? std::getenv("EXPERTD_SOCKET") : "/run/expertd/expertd.sock";
  bool json = false, prometheus = false, per_expert = false;  // per_expert: stats --experts
  double watch_s = 0;
  uint32_t layer = 0;
  std::vector<uint32_t> experts;
};

struct Verb {
  const char* name;
  const char* help;
  std::function<int(client::Client&, const Args&)> run;
};

int fail(const std::string& m) {
  std::fprintf(stderr, "expertctl: error: %s\n", m.c_str());
  return 1;
}

int cmd_stats(client::Client& c, const Args& a) {
  if (a.per_expert && !a.json) return ctl::cmd_experts_summary(c);
  for (;;) {
    if (a.per_expert) {  // one line of JSON per snapshot
      auto e = c.experts_json();
      if (!e) return fail(e.error().message);
      std::printf("%s\n", e->c_str());
      std::fflush(stdout);
      if (a.watch_s <= 0) return 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(a.watch_s * 1000)));
      continue;
    }
    auto m = c.stats();
    if (!m) return fail(m.error().message);
    std::string out = a.json         ? proto::render_json(*m) + "\n"
                      : a.prometheus ? proto::render_prometheus(*m)
                                     : proto::render_table(*m);
    if (a.watch_s > 0 && isatty(1)) std::fputs("\033[H\033[2J", stdout);
    std::fputs(out.c_str(), stdout);
    std::fflush(stdout);
    if (a.watch_s <= 0) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(a.watch_s * 1000)));
  }
}

int cmd_status(client::Client& c, const Args& a) {
  auto s = c.status_json();
  if (!s) return fail(s.error().message);
  auto j = nlohmann::json::parse(*s);
  if (a.json) {
    std::printf("%s\n", s->c_str());
    return 0;
  }
  const auto& m = j["model"];
  const auto& ar = j["arena"];
  std::printf("expertd %s\n", j["version"].get<std::string>().c_str());
  std::printf("model     %s (%s), id %s\n", m["name"].get<std::string>().c_str(),
              m["arch"].get<std::string>().c_str(), m["model_id"].get<std::string>().c_str());
  std::printf("shape     %zu MoE layers x %u experts, %u used per token\n", m["moe_layers"].size(),
              m["n_experts"].get<uint32_t>(), m["n_experts_used"].get<uint32_t>());
  std::printf("backend   %s, %u slots x %llu KiB = %llu MiB\n",
              ar["backend"].get<std::string>().c_str(), ar["slot_count"].get<uint32_t>(),
              (unsigned long long)(ar["slot_bytes"].get<uint64_t>() >> 10),
              (unsigned long long)(ar["arena_bytes"].get<uint64_t>() >> 20));
  if (ar["backend"] == "host" && ar.contains("huge_page_bytes"))
    std::printf("pages     %llu of %llu MiB in 2 MiB pages\n",
                (unsigned long long)(ar["huge_page_bytes"].get<uint64_t>() >> 20),
                (unsigned long long)(ar["arena_bytes"].get<uint64_t>() >> 20));
  std::printf("occupancy %llu used, %llu pinned\n",
              (unsigned long long)ar["slots_used"].get<uint64_t>(),
              (unsigned long long)ar["slots_pinned"].get<uint64_t>());
  std::printf("clients   %d\npolicy    %s\nconfig    %s\n", j["clients"].get<int>(),
              j["policy"].get<std::string>().c_str(), j["config"].dump().c_str());
  return 0;
}

int cmd_admin(client::Client& c, client::AdminOp op, const Args& a, const char* done) {
  auto st = c.admin(op, a.layer, a.experts);
  if (!st) return fail(st.error().message);
  std::printf("%s\n", done);
  return 0;
}

const std::vector<Verb>& verbs() {
  static const std::vector<Verb> v = {
      {"stats",
       "counters, gauges and latency percentiles (--json, --prometheus, --watch SECONDS);\n"
       "               --experts: per layer and expert (residency, hits, misses, what-if; --json)",
       cmd_stats},
      {"top",
       "the cache as a refreshing dashboard: hit rate, drive, latency, engines, a layer x\n"
       "               expert heat map, what other cache sizes would give (--watch SECONDS,\n"
       "               default 1; q or Ctrl-C quits; one frame when stdout is not a terminal)",
       [](client::Client& c, const Args& a) { return ctl::cmd_top(c, a.watch_s); }},
      {"status", "configuration, model shape, backend and occupancy (--json)", cmd_status},
      {"reset-stats", "zero the counters and histograms",
       [](client::Client& c, const Args& a) {
         return cmd_admin(c, client::AdminOp::ResetStats, a, "stats reset");
       }},
      {"evict-all", "drop every unpinned expert from the cache",
       [](client::Client& c, const Args& a) {
         return cmd_admin(c, client::AdminOp::EvictAll, a, "evicted");
       }},
      {"warmup", "load experts ahead of use: --layer L --experts 1,2,3",
       [](client::Client& c, const Args& a) {
         if (a.experts.empty()) {
           fail("warmup needs --experts (the engine's likely experts; never all of them)");
           return 2;
         }
         return cmd_admin(c, client::AdminOp::Warmup, a, "warmup queued");
       }},
  };
  return v;
}

void usage(FILE* f) {
  std::fprintf(f, "usage: expertctl [--socket PATH] VERB [options]\n\nverbs:\n");
  for (const auto& v : verbs()) std::fprintf(f, "  %-12s %s\n", v.name, v.help);
  std::fprintf(f, "  %-12s %s\n", "help", "this text");
  std::fprintf(f,
               "\noptions:\n  --socket PATH   expertd socket (default $EXPERTD_SOCKET or "
               "/run/expertd/expertd.sock)\n"
               "  --json          JSON output\n  --prometheus    Prometheus text format (stats)\n"
               "  --watch S       repeat every S seconds (stats, top)\n"
               "  --experts       per-expert view (stats)\n  --layer L, --experts LIST   "
               "for warmup\n");
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  std::string verb;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto need = [&](const char* what) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "expertctl: %s needs a value\n", what);
        std::exit(2);
      }
      return argv[++i];
    };
    try {
      if (s == "--socket")
        a.socket = need("--socket");
      else if (s == "--json")
        a.json = true;
      else if (s == "--prometheus")
        a.prometheus = true;
      else if (s == "--experts" &&  // a flag of stats; warmup's takes a list
               (verb == "stats" || i + 1 >= argc || !std::isdigit(argv[i + 1][0])))
        a.per_expert = true;
      else if (s == "--watch")
        a.watch_s = std::stod(need("--watch"));
      else if (s == "--layer")
        a.layer = static_cast<uint32_t>(std::stoul(need("--layer")));
      else if (s == "--experts") {
        std::stringstream ss(need("--experts"));
        for (std::string x; std::getline(ss, x, ',');)
          a.experts.push_back(static_cast<uint32_t>(std::stoul(x)));
      } else if (s == "-h" || s == "--help" || s == "help")
        verb = "help";
      else if (!s.empty() && s[0] != '-' && verb.empty())
        verb = s;
      else {
        std::fprintf(stderr, "expertctl: unknown argument %s\n", s.c_str());
        usage(stderr);
        return 2;
      }
    } catch (const std::exception&) {
      std::fprintf(stderr, "expertctl: bad value for %s\n", s.c_str());
      return 2;
    }
  }
  if (verb.empty() || verb == "help") {
    usage(verb.empty() ? stderr : stdout);
    return verb.empty() ? 2 : 0;
  }
  for (const auto& v : verbs()) {
    if (verb != v.name) continue;
    auto c = client::Client::connect(a.socket, {"expertctl", 10000, /*monitor=*/true});
    if (!c) return fail(c.error().message);
    return v.run(**c, a);
  }
  std::fprintf(stderr, "expertctl: unknown verb '%s'\n", verb.c_str());
  usage(stderr);
  return 2;
}
