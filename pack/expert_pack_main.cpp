// expert-pack: build, verify and inspect expert packs; write synthetic MoE models.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>

#include "engine/synth.h"
#include "kernels/kernels.h"
#include "pack/builder.h"
#include "pack/verify.h"

using namespace expertd;

namespace {
int fail(const Error& e) {
  std::fprintf(stderr, "expert-pack: error: %s\n", e.message.c_str());
  return 1;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "expert-pack: convert a GGUF MoE model into a core GGUF plus an expert pack "
      "(one 4096-aligned block per layer and expert, read with O_DIRECT)"};
  app.require_subcommand(1);
  bool quiet = false;
  app.add_flag("-q,--quiet", quiet, "no progress bar");

  auto* build =
      app.add_subcommand("build", "write STEM.expertpack, STEM.manifest.json and STEM.core.gguf");
  pack::BuildOptions bopt;
  bool verify_after = false;
  build->add_option("model", bopt.model_path, "MoE model GGUF (the first shard of a split model)")
      ->required();
  build->add_option("--out", bopt.out_dir, "output directory (default: the model's directory)");
  build->add_flag("--verify", verify_after,
                  "re-read the pack (O_DIRECT) and compare it with the source");
  std::string layout = "rows";
  build
      ->add_option("--layout", layout,
                   "how experts are stored: rows (as the GGUF; every engine and expertd "
                   "--backend cuda), or rows8 (" +
                       kernels::rows8_type_names() +
                       " matrices interleaved eight rows at a time: expert-run on the CPU decodes "
                       "them with no "
                       "copy, near --local's speed and with the same logits; a cuda expertd and "
                       "clients that read rows refuse such a pack)")
      ->check(CLI::IsMember({"rows", "rows8"}))
      ->capture_default_str();

  auto* verify = app.add_subcommand(
      "verify",
      "re-read a pack with O_DIRECT: checksums, and bytes equal to the source GGUF when present");
  pack::VerifyOptions vopt;
  verify->add_option("manifest", vopt.manifest_path, "STEM.manifest.json")->required();
  verify->add_option("--source", vopt.source_path,
                     "source GGUF (default: the path recorded in the manifest)");

  auto* insp = app.add_subcommand("inspect", "print a pack's layout");
  std::string insp_path;
  insp->add_option("manifest", insp_path, "STEM.manifest.json")->required();

  auto* synth = app.add_subcommand("synth", "write a synthetic MoE GGUF at real-model shapes");
  engine::SynthOptions sopt;
  std::string type_name = "Q4_K";
  synth->add_option("--preset", sopt.preset, "one of: " + engine::synth_preset_names());
  synth
      ->add_option(
          "--dims", sopt.dims,
          "custom shape: n_embd,n_layer,n_expert,n_expert_used,n_ff_exp[,n_head,n_head_kv,n_vocab] "
          "(with --preset: that architecture at this size)")
      ->delimiter(',');
  std::string gate_type, up_type, down_type;
  synth
      ->add_option("--type", type_name,
                   "weight type of the quantized tensors, any the kernels run: " +
                       kernels::supported_type_names() +
                       " (token embeddings of a type without a quantizer here are Q8_0)")
      ->capture_default_str();
  synth->add_option("--gate-type", gate_type, "weight type of the routed experts' gate tensors");
  synth->add_option("--up-type", up_type, "weight type of the routed experts' up tensors");
  synth->add_option("--down-type", down_type,
                    "weight type of the routed experts' down tensors: --type Q2_K --down-type Q3_K "
                    "is Kimi-K3's mix");
  synth->add_option("--layers", sopt.layers, "cut the depth to this many layers");
  synth->add_option("--seed", sopt.seed, "random seed")->capture_default_str();
  std::string routing = "zipf";
  synth
      ->add_option("--routing", routing,
                   "the routers' expert use: zipf (a few experts popular in every layer, as "
                   "DeepSeek-V4's and Qwen3's routing) or balanced (none favoured, as a router "
                   "trained for flat use: Kimi-K3's)")
      ->check(CLI::IsMember({"zipf", "balanced"}))
      ->capture_default_str();
  std::string chat_template_file;
  synth
      ->add_option("--chat-template", chat_template_file,
                   "a Jinja chat template to write as tokenizer.chat_template (e.g. the real "
                   "model's, from llama.cpp's models/templates)")
      ->check(CLI::ExistingFile);
  synth->add_option("--out", sopt.out_path, "output GGUF")->required();

  CLI11_PARSE(app, argc, argv);
  bopt.progress = vopt.progress = sopt.progress = !quiet;
  bopt.layout = layout == "rows8" ? pack::Layout::Rows8 : pack::Layout::Rows;

  if (build->parsed()) {
    auto rep = pack::build_pack(bopt);
    if (!rep) return fail(rep.error());
    if (!rep->direct_io)
      std::fprintf(stderr,
                   "expert-pack: warning: the output file system refused O_DIRECT; the pack "
                   "was written with buffered I/O (expertd will refuse to serve it from here)\n");
    std::printf(
        "pack      %s (%llu bytes)\ncore      %s (%llu bytes)\nmanifest  %s\n"
        "%.2f s, %.0f MiB/s of source\n",
        rep->pack_path.c_str(), (unsigned long long)rep->pack_bytes, rep->core_path.c_str(),
        (unsigned long long)rep->core_bytes, rep->manifest_path.c_str(), rep->seconds,
        rep->seconds > 0 ? rep->source_bytes / 1048576.0 / rep->seconds : 0.0);
    if (verify_after) {
      vopt.manifest_path = rep->manifest_path;
      vopt.source_path = bopt.model_path;
      auto v = pack::verify_pack(vopt);
      if (!v) return fail(v.error());
      std::printf("verified  %llu experts against the source\n",
                  (unsigned long long)v->experts_checked);
    }
    return 0;
  }
  if (verify->parsed()) {
    auto v = pack::verify_pack(vopt);
    if (!v) return fail(v.error());
    std::printf("ok: %llu experts, %llu bytes read with O_DIRECT, checksums match%s\n",
                (unsigned long long)v->experts_checked, (unsigned long long)v->bytes_read,
                v->source_compared ? ", bytes equal to the source GGUF" : "");
    if (!v->source_compared)
      std::printf("note: %s; source bytes not compared\n", v->source_note.c_str());
    return 0;
  }
  if (insp->parsed()) {
    auto m = pack::load_manifest(insp_path);
    if (!m) return fail(m.error());
    std::fputs(pack::inspect(*m).c_str(), stdout);
    return 0;
  }
  auto t = gguf::type_from_name(type_name);
  if (!t) return fail(make_error("unknown --type " + type_name));
  sopt.type = *t;
  sopt.routing =
      routing == "balanced" ? engine::SynthRouting::Balanced : engine::SynthRouting::Zipf;
  for (auto [name, opt, field] : {std::tuple{&gate_type, "--gate-type", &sopt.gate_type},
                                  std::tuple{&up_type, "--up-type", &sopt.up_type},
                                  std::tuple{&down_type, "--down-type", &sopt.down_type}}) {
    if (name->empty()) continue;
    auto rt = gguf::type_from_name(*name);
    if (!rt) return fail(make_error(std::string("unknown ") + opt + " " + *name));
    *field = *rt;
  }
  if (!chat_template_file.empty()) {
    std::ifstream in(chat_template_file, std::ios::binary);
    sopt.chat_template.assign(std::istreambuf_iterator<char>(in), {});
    if (!in.good() && !in.eof())
      return fail(make_error("cannot read --chat-template " + chat_template_file));
  }
  auto rep = engine::write_synth(sopt);
  if (!rep) return fail(rep.error());
  std::printf("wrote %s (%llu bytes)\n", sopt.out_path.c_str(), (unsigned long long)*rep);
  return 0;
}
