// expert-run as a user runs it: the CLI, a real expertd, hostile models, a daemon that dies.
#include <signal.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "golden_util.h"
#include "pack/builder.h"
#include "test_util.h"

using namespace expertd::test;

namespace {

std::string run_bin() {
  return bin("engine/expert-run");
}

}  // namespace

TEST(ExpertRun, GenerateThroughExpertdEqualsLocal) {
  REQUIRE_GOLDEN();
  Packed p("qwen2moe-B-s11-q4_k_m");
  // clients-max 3: each run may connect before the daemon has seen the previous one close.
  Daemon d(p.manifest, p.dir / "s.sock",
           {"--cache-slots", "15", "--clients-max", "3", "--max-experts-per-request", "5"});
  std::string log;
  ASSERT_TRUE(d.start(&log)) << log;
  for (std::string sampling : {"--temp 0", "--temp 0.9 --top-k 20 --top-p 0.9 --seed 7"}) {
    std::string args = " --prompt 'The experts stream from disk' -n 24 --threads 2 " + sampling;
    auto local =
        run(run_bin() + " generate --model " + p.model + " --local" + args + " 2>/dev/null");
    auto remote = run(run_bin() + " generate --model " + p.core + " --socket " + p.dir / "s.sock" +
                      args + " 2>/dev/null");
    ASSERT_EQ(local.first, 0) << local.second;
    ASSERT_EQ(remote.first, 0) << remote.second;
    EXPECT_EQ(local.second, remote.second) << sampling;
    EXPECT_GT(local.second.size(), 10u);
  }
  // Prefetch hints change what is read when, never the result.
  auto plain = run(run_bin() + " generate --model " + p.core + " --socket " + p.dir / "s.sock" +
                   " --prompt 'And the' -n 16 --temp 0 2>/dev/null");
  auto hinted = run(run_bin() + " generate --model " + p.core + " --socket " + p.dir / "s.sock" +
                    " --prompt 'And the' -n 16 --temp 0 --prefetch 2>/dev/null");
  EXPECT_EQ(plain.second, hinted.second);
  auto st = run(bin("client/expertctl") + " --socket " + p.dir / "s.sock" + " stats --json");
  auto sj =
      nlohmann::json::parse(st.second);  // the hints reached the daemon: loaded, or judged too cold
  EXPECT_GT(sj["prefetch_issued"].get<double>() + sj["prefetch_rejected"].get<double>(), 0)
      << st.second;
  auto verbose = run(run_bin() + " generate --model " + p.core + " --socket " + p.dir / "s.sock" +
                     " --prompt hi -n 4 --verbose");
  EXPECT_NE(verbose.second.find("expertd:"), std::string::npos) << verbose.second;
  EXPECT_NE(verbose.second.find("misses/token"), std::string::npos) << verbose.second;
  auto bench = run(run_bin() + " bench --model " + p.core + " --socket " + p.dir / "s.sock" +
                   " -p 16 -n 8 --json");
  ASSERT_EQ(bench.first, 0) << bench.second;
  EXPECT_NE(bench.second.find("\"decode_hit_rate\""), std::string::npos) << bench.second;
  // Logits through the CLI: n_tokens x n_vocab float32.
  auto lg = run(run_bin() + " logits --model " + p.core + " --socket " + p.dir / "s.sock" +
                " --tokens 1,2,3 --out " + p.dir / "l.bin");
  ASSERT_EQ(lg.first, 0) << lg.second;
  EXPECT_EQ(std::filesystem::file_size(p.dir / "l.bin"), 3u * 512 * 4);
}

// --speculative ngram: the greedy text of plain decoding, locally and through a real expertd
// (whose MoE layers get each verify eval's union of experts in one request), in fewer evals;
// --verbose reports the drafts' acceptance; the same on a model with a recurrent state.
// --speculative mtp: GLM-4.5-Air's and DeepSeek-V4's NextN blocks and the bundled model's trained
// head draft (their experts packed with the trunk's): the text is plain decoding's, locally and
// through expertd, and the drafts are counted; the trained head's are kept.
TEST(ExpertRun, MtpDraftsKeepTheGreedyText) {
  const std::string bundled = std::string(EXPERTD_SOURCE_DIR) + "/model/kjv-moe-mtp-q8_0.gguf";
  for (const std::string& model : std::vector<std::string>{
           "--preset glm-4.5-air --dims 128,3,8,2,64,4,2,512 --seed 3",
           "--preset deepseek-v4-flash --dims 128,4,8,2,64,4,1,512", bundled}) {
    SCOPED_TRACE(model);
    TempDir t;
    const bool trained = model == bundled;
    if (trained) {
      std::filesystem::copy_file(bundled, t / "m.gguf");
    } else {
      auto g = run(bin("pack/expert-pack") + " -q synth " + model + " --type Q8_0 --out " +
                   t / "m.gguf 2>&1");
      ASSERT_EQ(g.first, 0) << g.second;
    }
    expertd::pack::BuildOptions o;
    o.model_path = t / "m.gguf";
    o.progress = false;
    auto rep = expertd::pack::build_pack(o);
    ASSERT_TRUE(rep) << rep.error().message;
    Daemon d(rep->manifest_path, t / "g.sock", {"--cache-slots", "40", "--clients-max", "2"});
    std::string log;
    ASSERT_TRUE(d.start(&log)) << log;
    const std::string args =
        std::string(" --prompt 'And God said unto Moses, Go in unto Pharaoh' -n ") +
        (trained ? "96" : "48") + " --temp 0";
    auto plain =
        run(run_bin() + " generate --model " + t / "m.gguf" + " --local" + args + " 2>/dev/null");
    ASSERT_EQ(plain.first, 0) << plain.second;
    for (std::string where : {" --model " + t / "m.gguf" + " --local",
                              " --model " + rep->core_path + " --socket " + t / "g.sock"}) {
      SCOPED_TRACE(where);
      auto spec = run("(" + run_bin() + " generate" + where + args +
                      " --speculative mtp --draft-max 3 --verbose 2>" + t / "err.txt)");
      ASSERT_EQ(spec.first, 0) << spec.second;
      EXPECT_EQ(spec.second, plain.second);
      const std::string err = read_file(t / "err.txt");
      const size_t at = err.find("speculative mtp: ");
      ASSERT_NE(at, std::string::npos) << err;
      const size_t kept = err.find(" drafted, ", at);
      ASSERT_NE(kept, std::string::npos) << err;
      if (trained) {
        EXPECT_GT(std::stoi(err.substr(kept + 10)), 10) << err;
      }
    }
  }
}

TEST(ExpertRun, SpeculativeGenerationKeepsTheGreedyText) {
  REQUIRE_GOLDEN();
  Packed p("qwen3moe-B-s11-q4_k_m");
  Daemon d(p.manifest, p.dir / "s.sock",
           {"--cache-slots", "12", "--clients-max", "3", "--max-experts-per-request", "4"});
  std::string log;
  ASSERT_TRUE(d.start(&log)) << log;
  const std::string text =
                        " --prompt 'The experts stream from disk. The experts stream from' "
                        "-n 40 --threads 2",
                    args = text + " --temp 0";
  auto plain = run(run_bin() + " generate --model " + p.model + " --local" + args + " 2>/dev/null");
  ASSERT_EQ(plain.first, 0) << plain.second;
  for (std::string where : {" --model " + p.model + " --local",
                            " --model " + p.core + " --socket " + p.dir / "s.sock"}) {
    SCOPED_TRACE(where);
    auto spec = run(run_bin() + " generate" + where + args +
                    " --speculative ngram --draft-max 6 2>/dev/null");
    ASSERT_EQ(spec.first, 0) << spec.second;
    EXPECT_EQ(spec.second, plain.second);
  }
  auto v = run(run_bin() + " generate --model " + p.core + " --socket " + p.dir / "s.sock" + args +
               " --speculative ngram --verbose 2>&1");
  ASSERT_EQ(v.first, 0) << v.second;
  EXPECT_NE(v.second.find("speculative ngram: "), std::string::npos) << v.second;
  const size_t at = v.second.find("drafted, ");
  ASSERT_NE(at, std::string::npos) << v.second;
  EXPECT_GT(std::stoi(v.second.substr(at + 9)), 0) << "no draft was kept: " << v.second;
  // Sampling follows the acceptance rule: a valid generation, seeded, the same twice.
  const std::string sampled = text + " --temp 0.8 --seed 3 --speculative ngram 2>/dev/null";
  auto s1 = run(run_bin() + " generate --model " + p.model + " --local" + sampled);
  auto s2 = run(run_bin() + " generate --model " + p.model + " --local" + sampled);
  ASSERT_EQ(s1.first, 0) << s1.second;
  EXPECT_EQ(s1.second, s2.second);
  // A model without a NextN block has nothing to draft with: said at start-up.
  auto bad = run(run_bin() + " generate --model " + p.model +
                 " --local --prompt hi --speculative mtp 2>&1");
  EXPECT_NE(bad.first, 0);
  EXPECT_NE(bad.second.find("no NextN (multi-token prediction) block"), std::string::npos)
      << bad.second;
  // Qwen3.5's delta-rule layers keep a recurrent state: the verify's state is restored and the
  // kept tokens evaluated again (Engine::cut); the text is still plain decoding's, locally and
  // through expertd, and drafts are kept.
  TempDir t;
  auto q = run(bin("pack/expert-pack") + " -q synth --preset qwen3.5-397b-a17b " +
               "--dims 128,5,8,2,64,2,1,512 --type F16 --seed 3 --out " + t / "q35.gguf 2>&1");
  ASSERT_EQ(q.first, 0) << q.second;
  expertd::pack::BuildOptions o;
  o.model_path = t / "q35.gguf";
  o.progress = false;
  auto rep = expertd::pack::build_pack(o);
  ASSERT_TRUE(rep) << rep.error().message;
  Daemon dq(rep->manifest_path, t / "q.sock", {"--cache-slots", "32", "--clients-max", "2"});
  std::string qlog;
  ASSERT_TRUE(dq.start(&qlog)) << qlog;
  const std::string qargs =
      " --prompt 'The experts stream from disk. The experts stream from' -n 60 --temp 0";
  auto qplain =
      run(run_bin() + " generate --model " + t / "q35.gguf" + " --local" + qargs + " 2>/dev/null");
  ASSERT_EQ(qplain.first, 0) << qplain.second;
  for (std::string where : {" --model " + t / "q35.gguf" + " --local",
                            " --model " + rep->core_path + " --socket " + t / "q.sock"}) {
    SCOPED_TRACE(where);
    auto spec = run("(" + run_bin() + " generate" + where + qargs +
                    " --speculative ngram --draft-max 6 --verbose 2>" + t / "err.txt)");
    ASSERT_EQ(spec.first, 0) << spec.second;
    EXPECT_EQ(spec.second, qplain.second);
    const std::string err = read_file(t / "err.txt");
    const size_t at = err.find("drafted, ");
    ASSERT_NE(at, std::string::npos) << err;
    EXPECT_GT(std::stoi(err.substr(at + 9)), 0) << "no draft was kept: " << err;
  }
}

TEST(ExpertRun, TokenizeHasLlamaTokenizeSemantics) {
  std::string vocab =
      std::string(EXPERTD_SOURCE_DIR) + "/tests/data/tokenizer/ggml-vocab-synth-qwen2.gguf";
  auto special = run(run_bin() + " tokenize --model " + vocab + " --text '<|im_start|>hello'");
  ASSERT_EQ(special.first, 0) << special.second;
  EXPECT_EQ(special.second.substr(0, 4), "509 ");
  auto plain = run(run_bin() + " tokenize --model " + vocab +
                   " --text '<|im_start|>hello' --no-parse-special");
  EXPECT_NE(plain.second.substr(0, 4), "509 ");
  auto bos = run(run_bin() + " tokenize --model " + vocab + " --text hello --add-bos");
  EXPECT_EQ(bos.second.substr(0, 4), "508 ");
  EXPECT_EQ(std::count(special.second.begin(), special.second.end(), '\n'), 1);
  // The empty text is one of llama.cpp's vocab vectors: no tokens, an empty line.
  auto empty = run(run_bin() + " tokenize --model " + vocab + " --text ''");
  ASSERT_EQ(empty.first, 0) << empty.second;
  EXPECT_EQ(empty.second, "\n");
}

TEST(ExpertRun, HostileModelsGetClearErrors) {
  REQUIRE_GOLDEN();
  TempDir d;
  auto expect_error = [&](const std::string& model, const std::string& needle) {
    auto r = run(run_bin() + " generate --model " + model + " --local --prompt hi -n 2");
    EXPECT_EQ(r.first, 1) << r.second;
    EXPECT_NE(r.second.find(needle), std::string::npos) << r.second;
  };
  std::string src = read_file(golden_model("olmoe-A-s1-q8_0"));
  write_file(d / "trunc.gguf", src.substr(0, src.size() - 1000));
  expect_error(d / "trunc.gguf", "beyond the end of the file");
  // A missing tensor and an unsupported type, written with the GGUF writer.
  auto m = gguf::Model::open(golden_model("olmoe-A-s1-q8_0"));
  ASSERT_TRUE(m);
  // A copy without tensor `drop`, with one tensor retyped, or declaring another architecture.
  auto rewrite = [&](const std::string& out, const std::string& drop, bool retype,
                     const std::string& arch = "") {
    gguf::Writer w(m->alignment());
    for (const auto& kv : m->kvs())
      if (arch.empty() || kv.key != "general.architecture") w.add_raw_kv(kv.raw);
    if (!arch.empty()) w.add_string("general.architecture", arch);
    std::vector<const gguf::TensorInfo*> kept;
    for (const auto& t : m->tensors()) {
      if (t.name == drop) continue;
      auto type = retype && t.name == "blk.1.attn_k.weight" ? gguf::GgmlType::Q8_K : t.type;
      w.add_tensor(t.name, type, std::vector<uint64_t>(t.ne.begin(), t.ne.begin() + t.n_dims));
      kept.push_back(&t);
    }
    std::string data(w.file_bytes(), '\0');
    auto h = w.header();
    std::memcpy(data.data(), h.data(), h.size());
    for (size_t i = 0; i < kept.size(); ++i)
      std::memcpy(data.data() + w.tensor_offset(i), kept[i]->data,
                  std::min<uint64_t>(kept[i]->nbytes, w.tensor_bytes(i)));
    write_file(out, data);
  };
  rewrite(d / "missing.gguf", "blk.0.attn_q.weight", false);
  expect_error(d / "missing.gguf", "missing tensor blk.0.attn_q.weight");
  // Q8_K is a type of activations only: no kernel runs it as weights; the error lists the table's.
  rewrite(d / "q8_k.gguf", "", true);
  expect_error(d / "q8_k.gguf", "blk.1.attn_k.weight has type Q8_K");
  expect_error(d / "q8_k.gguf", "IQ2_XXS");
  // An architecture the engine does not implement: the error names it and the supported ones.
  rewrite(d / "arch.gguf", "", false, "mamba2");
  expect_error(d / "arch.gguf", "architecture 'mamba2' is not supported");
}

TEST(ExpertRun, ADaemonThatDiesMidGenerationIsAnErrorNotAHang) {
  REQUIRE_GOLDEN();
  Packed p("llama-A-s1-f32");
  Daemon d(p.manifest, p.dir / "s.sock",
           {"--cache-slots", "16", "--clients-max", "1", "--max-experts-per-request", "8"});
  ASSERT_TRUE(d.start());
  std::string out = p.dir / "out.txt";
  pid_t pid = ::fork();
  if (pid == 0) {
    FILE* f = std::fopen(out.c_str(), "w");
    ::dup2(fileno(f), 1);
    ::dup2(fileno(f), 2);
    std::string sock = p.dir / "s.sock";
    ::execl(run_bin().c_str(), "expert-run", "generate", "--model", p.core.c_str(), "--socket",
            sock.c_str(), "--prompt", "hello", "-n", "100000", "--ctx", "100000", "--threads", "1",
            "--no-reconnect", nullptr);
    ::_exit(127);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::kill(d.pid(), SIGKILL);
  auto start = std::chrono::steady_clock::now();
  int st = 0;
  while (::waitpid(pid, &st, WNOHANG) == 0) {
    ASSERT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20))
        << "expert-run hangs";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 1);
  std::string text = read_file(out);
  EXPECT_NE(text.find("expertd closed the connection"), std::string::npos)
      << text.substr(text.size() > 300 ? text.size() - 300 : 0);
}

// A daemon restart (SIGKILL, then a new expertd on the same socket) mid-generation: expert-run
// reconnects (generate's default), checks the model again and finishes with the text an
// uninterrupted run gives.
TEST(ExpertRun, GenerationSurvivesADaemonRestartWithIdenticalText) {
  REQUIRE_GOLDEN();
  Packed p("llama-A-s1-f32");
  const std::string args = " --prompt hello -n 3000 --temp 0 --threads 1";
  auto ref = run(run_bin() + " generate --model " + p.model + " --local" + args + " 2>/dev/null");
  ASSERT_EQ(ref.first, 0) << ref.second;
  const std::string sock = p.dir / "s.sock";
  const std::vector<std::string> flags = {
      "--cache-slots", "16", "--clients-max", "2", "--max-experts-per-request", "8"};
  auto d = std::make_unique<Daemon>(p.manifest, sock, flags);
  ASSERT_TRUE(d->start());
  const std::string out = p.dir / "out.txt", err = p.dir / "err.txt";
  pid_t pid = ::fork();
  if (pid == 0) {
    FILE* o = std::fopen(out.c_str(), "w");
    FILE* e = std::fopen(err.c_str(), "w");
    ::dup2(fileno(o), 1);
    ::dup2(fileno(e), 2);
    ::execl(run_bin().c_str(), "expert-run", "generate", "--model", p.core.c_str(), "--socket",
            sock.c_str(), "--prompt", "hello", "-n", "3000", "--temp", "0", "--threads", "1",
            "--reconnect-s", "20", nullptr);
    ::_exit(127);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  ::kill(d->pid(), SIGKILL);  // mid-generation (3000 tokens take seconds)
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  d = std::make_unique<Daemon>(p.manifest, sock, flags);
  ASSERT_TRUE(d->start());
  auto start = std::chrono::steady_clock::now();
  int st = 0;
  while (::waitpid(pid, &st, WNOHANG) == 0) {
    ASSERT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60))
        << "expert-run hangs";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(WIFEXITED(st));
  const std::string e = read_file(err);
  ASSERT_EQ(WEXITSTATUS(st), 0) << e;
  EXPECT_NE(e.find("came back 1 time"), std::string::npos) << e;
  EXPECT_EQ(read_file(out), ref.second);
}

std::string template_file(const std::string& name) {
  return std::string(EXPERTD_SOURCE_DIR) + "/tests/data/templates/" + name;
}

TEST(ExpertRun, ChatRendersTheModelsTemplateOrSaysWhyNot) {
  REQUIRE_GOLDEN();
  // --chat-template: Qwen3's real template, thinking off, on the golden qwen3moe's vocabulary.
  const std::string qwen3 = " --chat-template " + template_file("Qwen-Qwen3-0.6B.jinja");
  auto gids = [&](const std::string& args) {
    auto r = run(run_bin() + " tokenize --model " + golden_model("qwen3moe-A-s1-f32") + " " + args);
    EXPECT_EQ(r.first, 0) << r.second;
    return r.second;
  };
  TempDir d;
  std::ofstream(d / "want.txt")
      << "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
  EXPECT_EQ(gids("--chat --text hello" + qwen3), gids("--file " + d / "want.txt"));
  auto ok = run(run_bin() + " generate --model " + golden_model("qwen3moe-A-s1-f32") + qwen3 +
                " --local --chat --prompt hello -n 4 --temp 0 --verbose 2>&1");
  EXPECT_EQ(ok.first, 0) << ok.second;
  EXPECT_NE(ok.second.find("generated"), std::string::npos) << ok.second;
  // Kimi-K3: its template, written into the GGUF by synth (tokenizer.chat_template), renders the
  // turn with thinking off (the answer in the response channel).
  auto s = run(bin("pack/expert-pack") + " -q synth --preset kimi-k3 --dims 64,2,8,2,32,4,1,512 " +
               "--type F32 --chat-template " + template_file("Kimi-K3.jinja") + " --out " +
               d / "k3.gguf");
  ASSERT_EQ(s.first, 0) << s.second;
  auto ids = [&](const std::string& args) {
    auto r = run(run_bin() + " tokenize --model " + d / "k3.gguf" + " " + args);
    EXPECT_EQ(r.first, 0) << r.second;
    return r.second;
  };
  EXPECT_EQ(ids("--chat --text hi"),
            ids("--text '<|open|>message role=\"user\"<|sep|>hi<|close|>message<|sep|>"
                "<|end_of_msg|><|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>'"));
  auto one = ids("--text '<|end_of_msg|>'");
  EXPECT_EQ(one.find(' '), std::string::npos) << one;  // a special token, one id
  auto k3 = run(run_bin() + " generate --model " + d / "k3.gguf" +
                " --local --chat --prompt hello -n 4 --temp 0 --verbose 2>&1");
  EXPECT_EQ(k3.first, 0) << k3.second;
  // The bundled model was trained on plain text and carries no template: a clear refusal.
  auto no = run(run_bin() + " generate --chat --prompt hello -n 4 2>&1");
  EXPECT_EQ(no.first, 1);
  EXPECT_NE(no.second.find("no chat template"), std::string::npos) << no.second;
  // A template that fails names its own error.
  std::ofstream(d / "bad.jinja") << "{{ raise_exception('only system turns, please') }}";
  auto bad =
      run(run_bin() + " tokenize --chat --text hi --chat-template " + d / "bad.jinja" + " 2>&1");
  EXPECT_EQ(bad.first, 1);
  EXPECT_NE(bad.second.find("only system turns, please"), std::string::npos) << bad.second;
}

// DeepSeek-V4's turn as its template (llama.cpp's deepseek-ai-DeepSeek-V4-Flash-0731.jinja,
// written into the GGUF by synth, rendered by expert-run: add_generation_prompt, thinking off)
// writes it; the model generates from it; and with --prefetch (the hash-routed layer predicted from
// its table) the logits stay bit-identical.
TEST(ExpertRun, DeepseekV4ChatFormatAndPrefetch) {
  TempDir d;
  const std::string model = d / "v4.gguf";
  auto s = run(bin("pack/expert-pack") + " -q synth --preset deepseek-v4-flash --dims " +
               "128,4,8,2,64,4,1,512 --type F32 --chat-template " +
               template_file("deepseek-ai-DeepSeek-V4-Flash-0731.jinja") + " --out " + model);
  ASSERT_EQ(s.first, 0) << s.second;
  auto ids = [&](const std::string& args) {
    auto r = run(run_bin() + " tokenize --model " + model + " " + args);
    EXPECT_EQ(r.first, 0) << r.second;
    return r.second;
  };
  // The template opens with bos_token (a synthetic model's is <|endoftext|>).
  EXPECT_EQ(ids("--chat --text hi"),
            ids("--text '<|endoftext|><｜User｜>hi<｜Assistant｜></think>'"));
  EXPECT_EQ(ids("--text '</think>'").find(' '), std::string::npos);  // one special token
  auto g = run(run_bin() + " generate --model " + model +
               " --local --chat --prompt hello -n 4 --temp 0 2>&1");
  EXPECT_EQ(g.first, 0) << g.second;
  const std::string tokens = " --tokens 11,250,100,77,500,42,9,300,12,13,14,15,16,17,18,19";
  auto a = run(run_bin() + " logits --model " + model + " --local --out " + d / "a.bin" + tokens);
  auto p = run(run_bin() + " logits --model " + model + " --local --prefetch --out " + d / "p.bin" +
               tokens);
  ASSERT_EQ(a.first, 0) << a.second;
  ASSERT_EQ(p.first, 0) << p.second;
  EXPECT_TRUE(read_file(d / "a.bin") == read_file(d / "p.bin"));
  // The hash-routed layer (layer 0 here) is predicted from the token before any layer runs and
  // never wrongly; it is reported apart from the routers' predictions.
  auto b = run(run_bin() + " bench --model " + model + " --local --prefetch -p 8 -n 8 --json");
  ASSERT_EQ(b.first, 0) << b.second;
  auto j = nlohmann::json::parse(b.second.substr(b.second.find('{')));
  ASSERT_TRUE(j.contains("decode_hashed")) << b.second;
  ASSERT_EQ(j["decode_hashed"].size(), 1u);
  EXPECT_EQ(j["decode_hashed"][0]["layer"], 0);
  EXPECT_EQ(j["decode_hashed"][0]["recall"].get<double>(), 1.0);
  EXPECT_EQ(j["decode_hashed"][0]["waste"].get<double>(), 0.0);
  for (const auto& x : j["decode_prediction"]) EXPECT_NE(x["layer"], 0) << b.second;
}

// Architectures without golden data, as `expert-pack synth` writes them at test size (their
// numerics were checked against llama.cpp when they were added: bit-identical logits for the
// Q8_0 models below): they load, run, and through expertd give the same logits as --local.
TEST(ExpertRun, SynthGlm45DeepseekV2LiteAndKimiK3RunLocallyAndThroughExpertd) {
  for (const std::string preset : {"glm-4.5-air", "deepseek-v2-lite", "kimi-k3"}) {
    SCOPED_TRACE(preset);
    TempDir d;
    const std::string model = d / "m.gguf";
    auto s = run(bin("pack/expert-pack") + " -q synth --preset " + preset +
                 " --dims 256,3,16,4,256,4,2,512 --type Q8_0 --out " + model);
    ASSERT_EQ(s.first, 0) << s.second;
    auto b = run(bin("pack/expert-pack") + " -q build " + model);
    ASSERT_EQ(b.first, 0) << b.second;
    // 12 of 32 experts cached: misses, evictions and chunked acquires.
    Daemon daemon(d / "m.manifest.json", d / "s.sock",
                  {"--cache-slots", "12", "--clients-max", "3", "--max-experts-per-request", "4"});
    std::string log;
    ASSERT_TRUE(daemon.start(&log)) << log;
    const std::string tokens = " --tokens 11,250,100,77,500,42,9,300 --threads 2";
    auto a = run(run_bin() + " logits --model " + model + " --local --out " + d / "a.bin" + tokens);
    auto r = run(run_bin() + " logits --model " + d / "m.core.gguf" + " --socket " + d / "s.sock" +
                 " --out " + d / "r.bin" + tokens);
    ASSERT_EQ(a.first, 0) << a.second;
    ASSERT_EQ(r.first, 0) << r.second;
    const std::string la = read_file(d / "a.bin"), lr = read_file(d / "r.bin");
    EXPECT_EQ(la.size(), 8u * 512 * 4);
    EXPECT_TRUE(la == lr) << "daemon and local logits differ";
  }
}

// Next-layer prediction (--prefetch): the routers one and two layers ahead, applied to the
// residual stream before a layer's experts run, predict the experts the bundled model's layers
// then use far better than chance (4 of 32: 0.125), and computing them never changes the logits.
TEST(ExpertRun, NextLayerPredictionIsScoredAndLeavesTheLogitsAlone) {
  auto b = run(run_bin() + " bench --local --prefetch -p 16 -n 64 --json");
  ASSERT_EQ(b.first, 0) << b.second;
  auto j = nlohmann::json::parse(b.second);
  ASSERT_TRUE(j.contains("decode_prediction")) << b.second;
  EXPECT_EQ(j["decode_prediction"].size(), 3u);  // layers 1-3 (layer 0 has no earlier router)
  EXPECT_GT(j["decode_recall_1"].get<double>(), 0.375);
  EXPECT_GT(j["decode_recall_2"].get<double>(), 0.25);
  for (const auto& l : j["decode_prediction"]) {
    EXPECT_LE(l["recall_1"].get<double>(), 1.0);
    EXPECT_GE(l["waste_1"].get<double>(), 0.0);
  }
  TempDir d;
  const std::string tokens = " --tokens 5,17,99,3,250,42,7,300,11,64 --decode-from 4";
  auto a = run(run_bin() + " logits --local --out " + d / "a.bin" + tokens);
  auto p = run(run_bin() + " logits --local --prefetch --out " + d / "p.bin" + tokens);
  ASSERT_EQ(a.first, 0) << a.second;
  ASSERT_EQ(p.first, 0) << p.second;
  EXPECT_TRUE(read_file(d / "a.bin") == read_file(d / "p.bin"));
}

// --prompt-cache, as llama.cpp's flag: a later prompt that begins with an earlier one resumes
// its state (the text unchanged); another model's file or a damaged one is a clear error.
TEST(ExpertRun, PromptCacheResumesTheSharedPrefixAndRefusesAnotherModelsFile) {
  TempDir dir;
  const std::string model = std::string(EXPERTD_SOURCE_DIR) + "/model/kjv-moe-q8_0.gguf";
  const std::string cache = dir / "prompt.cache";
  const std::string p1 =
      "And God said unto Moses, Go down, and charge the people, lest they "
      "break through unto the LORD to gaze";
  const std::string p2 = p1 + ", and many of them perish";
  // The generated text, and the prompt cache's line (on stderr, merged by run()).
  struct Out {
    int rc;
    std::string text, said;
  };
  auto gen = [&](const std::string& m, const std::string& prompt, const std::string& extra) {
    auto r = run(run_bin() + " generate --model " + m + " --local --threads 2 -n 16 --temp 0 " +
                 "--prompt '" + prompt + "' " + extra);
    Out o{r.first, r.second, ""};
    const size_t at = o.text.find("expert-run: ");
    if (at != std::string::npos) {
      const size_t nl = o.text.find('\n', at);
      o.said = o.text.substr(at, nl - at);
      o.text.erase(at, nl - at + 1);
    }
    return o;
  };
  auto first = gen(model, p1, "--prompt-cache " + cache);
  ASSERT_EQ(first.rc, 0) << first.text;
  EXPECT_NE(first.said.find(": 0 of "), std::string::npos) << first.said;
  auto resumed = gen(model, p2, "--prompt-cache " + cache);
  ASSERT_EQ(resumed.rc, 0) << resumed.text;
  auto plain = gen(model, p2, "");
  EXPECT_EQ(resumed.text, plain.text);
  EXPECT_NE(resumed.said.find("prompt tokens resumed"), std::string::npos) << resumed.said;
  EXPECT_EQ(resumed.said.find(": 0 of "), std::string::npos) << resumed.said;  // a prefix resumed
  // Another model's file.
  const std::string other = dir / "other.gguf";
  {
    std::ifstream in(model, std::ios::binary);
    std::ofstream out(other, std::ios::binary);
    out << in.rdbuf() << "x";  // another file (its size, so its identity)
  }
  auto refused = gen(other, p2, "--prompt-cache " + cache);
  EXPECT_NE(refused.rc, 0);
  EXPECT_NE(refused.said.find("of another model"), std::string::npos) << refused.text;
  // The same model with the other cache type: refused too; its own F16 file resumes.
  auto other_type = gen(model, p2, "--kv-type f16 --prompt-cache " + cache);
  EXPECT_NE(other_type.rc, 0);
  EXPECT_NE(other_type.said.find("another --kv-type"), std::string::npos) << other_type.text;
  const std::string cache16 = dir / "prompt16.cache";
  ASSERT_EQ(gen(model, p1, "--kv-type f16 --prompt-cache " + cache16).rc, 0);
  auto resumed16 = gen(model, p2, "--kv-type f16 --prompt-cache " + cache16);
  ASSERT_EQ(resumed16.rc, 0) << resumed16.text;
  EXPECT_EQ(resumed16.said.find(": 0 of "), std::string::npos) << resumed16.said;
  EXPECT_EQ(resumed16.text, gen(model, p2, "--kv-type f16").text);
  // Without --model (the bundled model): the cache is tied to the bundled model's file.
  auto bundled = run(run_bin() + " generate --local --threads 2 -n 4 --temp 0 --prompt 'And God' " +
                     "--prompt-cache " + std::string(dir / "bundled.cache"));
  EXPECT_EQ(bundled.first, 0) << bundled.second;
  // A damaged file.
  {
    std::fstream f(cache, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x55');
  }
  auto damaged = gen(model, p2, "--prompt-cache " + cache);
  EXPECT_NE(damaged.rc, 0);
  EXPECT_NE(damaged.said.find("damaged"), std::string::npos) << damaged.text;
}
