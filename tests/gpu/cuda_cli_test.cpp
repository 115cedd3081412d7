// The GPU tier's command lines, as scripts/gpu-check.sh and users run them: expert-run --device
// cuda through a cuda expertd and with --local (bit-identical logits), its bench, expertctl's
// cuda counters, and the GPU benchmarks of expert-bench at a small size (they run, count no
// errors and print their ratio). On a GPU; and in CI against the CPU emulation of the CUDA runtime
// (tests/cuda_emu) with the programs' _emu builds.
#include <fstream>
#include <nlohmann/json.hpp>

#include "gpu_util.h"
#include "test_util.h"

namespace expertd::test {
namespace {

std::string prog(const std::string& rel) {
  return bin(rel + kEmuSuffix);
}

// A Qwen3-MoE-shaped model at test size, packed: its manifest and core GGUF beside it in d.
std::string packed_synth_model(const TempDir& d) {
  const std::string model = d / "m.gguf";
  auto s = run(bin("pack/expert-pack") +
               " -q synth --preset qwen3-30b-a3b --dims 256,2,16,4,256,4,2,512 --type Q8_0 --out " +
               model);
  EXPECT_EQ(s.first, 0) << s.second;
  auto b = run(bin("pack/expert-pack") + " -q build " + model);
  EXPECT_EQ(b.first, 0) << b.second;
  return model;
}

TEST(CudaCli, ExpertRunThroughACudaExpertdMatchesLocalAndExpertctlCountsTheCopies) {
  EXPERTD_REQUIRE_GPU();
  TempDir d;
  const std::string model = packed_synth_model(d);
  ASSERT_FALSE(::testing::Test::HasFailure());
  // 8 of 32 experts cached: most acquires miss and every miss is copied into the arena.
  Daemon daemon(d / "m.manifest.json", d / "s.sock",
                {"--backend", "cuda", "--cache-slots", "8", "--clients-max", "2",
                 "--max-experts-per-request", "4"});
  std::string log;
  ASSERT_TRUE(daemon.start(&log)) << log;
  const std::string er = prog("engine/expert-run"),
                    tokens = " --tokens 5,99,300,7,250,11 --decode-from 3";
  auto g = run(er + " logits --model " + model + " --local --device cuda --out " + d / "g.bin" +
               tokens + " 2>&1");
  auto r = run(er + " logits --model " + d / "m.core.gguf" + " --socket " + d / "s.sock" +
               " --device cuda --out " + d / "r.bin" + tokens + " 2>&1");
  ASSERT_EQ(g.first, 0) << g.second;
  ASSERT_EQ(r.first, 0) << r.second;
  const std::string lg = read_file(d / "g.bin"), lr = read_file(d / "r.bin");
  EXPECT_EQ(lg.size(), 6u * 512 * 4);
  EXPECT_TRUE(lg == lr) << "the cuda expertd's slots and uploaded experts give different logits";
  auto bench = run(er + " bench --model " + d / "m.core.gguf" + " --socket " + d / "s.sock" +
                   " --device cuda -p 8 -n 4 --ctx 64 --json");
  ASSERT_EQ(bench.first, 0) << bench.second;
  auto bj = nlohmann::json::parse(bench.second.substr(bench.second.find('{')));
  EXPECT_GT(bj["decode_tok_s"].get<double>(), 0.0) << bench.second;
  auto ctl = run(bin("client/expertctl") + " --socket " + d / "s.sock" + " stats --json");
  ASSERT_EQ(ctl.first, 0) << ctl.second;
  auto st = nlohmann::json::parse(ctl.second);
  EXPECT_GT(st["h2d_bytes"].get<double>(), 0);
  EXPECT_EQ(st["h2d_bytes"].get<double>(), st["pack_read_bytes"].get<double>());
  EXPECT_EQ(st["copy_errors"].get<int>(), 0);
  EXPECT_EQ(st["io_errors"].get<int>(), 0);
}

TEST(CudaCli, ExpertBenchStagingAndMissDeliveryRunAndPrintTheirRatio) {
  EXPERTD_REQUIRE_GPU();
  auto h = run(prog("bench/expert-bench") +
               " h2d --slot-kib 256 --slots 16 --stage-slots 4 --seconds 0.2 2>&1");
  ASSERT_EQ(h.first, 0) << h.second;
  EXPECT_NE(h.second.find("ratio="), std::string::npos) << h.second;
  EXPECT_NE(h.second.find(" 0 copy errors"), std::string::npos) << h.second;
  TempDir d;
  const std::string model = packed_synth_model(d);
  ASSERT_FALSE(::testing::Test::HasFailure());
  auto io = run(prog("bench/expert-bench") + " io --manifest " + d / "m.manifest.json" +
                " --backend cuda --seconds 0.3 --clients 2 --queue-depth 4 2>&1");
  ASSERT_EQ(io.first, 0) << io.second;
  EXPECT_NE(io.second.find("ratio="), std::string::npos) << io.second;
}

// expert-serve on the GPU (--device cuda, through the one engine factory, as expert-run): on the
// bundled model a greedy completion is the CPU's text, and the start-up line names the device; a
// KV cache type the GPU backend does not keep is refused at start, naming it.
TEST(CudaCli, ExpertServeOnTheGpuAnswersAsTheCpu) {
  EXPERTD_REQUIRE_GPU();
  TempDir d;
  auto complete = [&](const std::string& device, std::string* log) {
    const std::string logf = d / ("serve-" + device + ".log");
    const std::string script =
        prog("serve/expert-serve") + " --local --device " + device +
        " --port 0 --threads 2 --parallel 1 --ctx 64 --prefix-cache-mib 0 2> " + logf +
        " & pid=$!\n"
        "for i in $(seq 600); do port=$(sed -n 's|.*on http://127.0.0.1:\\([0-9]*\\).*|\\1|p' " +
        logf +
        "); [ -n \"$port\" ] && break; sleep 0.1; done\n"
        "python3 -c 'import json, sys, urllib.request as u\n"
        "b = json.dumps({\"prompt\": \"And God said\", \"max_tokens\": 8, \"temperature\": 0})\n"
        "r = u.urlopen(u.Request(sys.argv[1] + \"/v1/completions\", data=b.encode(), "
        "headers={\"Content-Type\": \"application/json\"}), timeout=600)\n"
        "print(\"TEXT=\" + json.dumps(json.load(r)[\"choices\"][0][\"text\"]))' "
        "http://127.0.0.1:$port\n"
        "rc=$?; kill $pid; wait $pid; exit $rc\n";
    const std::string sh = d / ("serve-" + device + ".sh");
    std::ofstream(sh) << script;
    auto r = run("bash " + sh);
    *log = read_file(logf);
    EXPECT_EQ(r.first, 0) << r.second << *log;
    const size_t at = r.second.find("TEXT=");
    return at == std::string::npos ? std::string() : r.second.substr(at);
  };
  std::string gpu_log, cpu_log;
  const std::string gpu = complete("cuda", &gpu_log), cpu = complete("cpu", &cpu_log);
  EXPECT_FALSE(gpu.empty());
  EXPECT_EQ(gpu, cpu) << "expert-serve --device cuda and --device cpu answer differently";
  EXPECT_NE(gpu_log.find("engine on cuda:"), std::string::npos) << gpu_log;  // the GPU backend ran
  auto f16 = run(prog("serve/expert-serve") + " --local --device cuda --kv-type f16 --port 0");
  EXPECT_NE(f16.first, 0);
  EXPECT_NE(f16.second.find("keeps its KV cache in f32"), std::string::npos) << f16.second;
}

}  // namespace
}  // namespace expertd::test
