// expert-run: the bundled engine. Generates text, writes logits, benchmarks, tokenizes.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "engine/engine.h"

using namespace engine;

namespace {

[[noreturn]] void die(const std::string& m) {
  std::fprintf(stderr, "expert-run: error: %s\n", m.c_str());
  std::exit(1);
}

struct Common {
  std::string model, socket;
  bool local = false;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int ctx = 4096;
};

void add_common(CLI::App* c, Common& o) {
  c->add_option("--model", o.model, "model GGUF, or the core GGUF of an expert pack")->required();
  c->add_option("--socket", o.socket, "expertd socket: experts come from the daemon");
  c->add_flag("--local", o.local, "read experts in place from the GGUF (the reference path)");
  c->add_option("--threads", o.threads, "CPU threads")->capture_default_str();
  c->add_option("--ctx", o.ctx, "context length (KV cache)")->capture_default_str();
}

struct Loaded {
  std::unique_ptr<gguf::Model> file;
  std::unique_ptr<Model> model;
  std::unique_ptr<ExpertSource> source;
};

Loaded load(const Common& o) {
  Loaded l;
  auto f = gguf::Model::open(o.model);
  if (!f) die(f.error().message);
  l.file = std::make_unique<gguf::Model>(std::move(*f));
  auto m = Model::load(*l.file);
  if (!m) die(m.error().message);
  l.model = std::make_unique<Model>(std::move(*m));
  if (o.local && !o.socket.empty()) die("--local and --socket exclude each other");
  if (!o.socket.empty()) {
    auto s = make_daemon_source(*l.model, o.socket);
    if (!s) die(s.error().message);
    l.source = std::move(*s);
  } else {
    if (!l.model->has_local_experts)
      die(o.model + " is a core GGUF without experts: pass --socket of the expertd serving its pack");
    l.source = make_local_source(*l.model);
  }
  return l;
}

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) {
    try {
      out.push_back(std::stoi(x));
    } catch (...) {
      die("bad token id '" + x + "'");
    }
  }
  return out;
}

int cmd_logits(const Common& o, const std::string& tokens_csv, const std::string& out, int decode_from) {
  Loaded l = load(o);
  auto ids = parse_ids(tokens_csv);
  if (ids.empty()) die("--tokens is empty");
  Engine eng(*l.model, *l.source, o.threads, std::max<int>(o.ctx, static_cast<int>(ids.size())));
  std::vector<float> all, step;
  size_t first = decode_from > 0 ? std::min<size_t>(decode_from, ids.size()) : ids.size();
  if (auto st = eng.eval({ids.data(), first}, true, all); !st) die(st.error().message);
  for (size_t i = first; i < ids.size(); ++i) {
    if (auto st = eng.eval({ids.data() + i, 1}, true, step); !st) die(st.error().message);
    all.insert(all.end(), step.begin(), step.end());
  }
  std::ofstream f(out, std::ios::binary);
  f.write(reinterpret_cast<const char*>(all.data()), static_cast<std::streamsize>(all.size() * 4));
  if (!f) die("cannot write " + out);
  std::fprintf(stderr, "wrote %zu x %d logits to %s\n", ids.size(), l.model->hp.n_vocab, out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"expert-run: MoE inference on the CPU with experts from expertd (or the GGUF)"};
  app.require_subcommand(1);
  Common co;
  auto* logits = app.add_subcommand("logits", "write float32 logits of every position, shape [n_tokens, n_vocab]");
  add_common(logits, co);
  std::string tokens, out;
  int decode_from = 0;
  logits->add_option("--tokens", tokens, "comma-separated token ids")->required();
  logits->add_option("--out", out, "output file")->required();
  logits->add_option("--decode-from", decode_from,
                     "evaluate the first N tokens as one batch, the rest one at a time (0: all in one batch)");
  CLI11_PARSE(app, argc, argv);
  if (logits->parsed()) return cmd_logits(co, tokens, out, decode_from);
  return 0;
}
