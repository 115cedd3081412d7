#include "serve/grammar.h"

#include <limits>

#ifdef EXPERTD_HAVE_XGRAMMAR
#include <xgrammar/xgrammar.h>
#endif

namespace expertd::serve {

const char* kind_name(GrammarSpec::Kind k) {
  switch (k) {
    case GrammarSpec::Kind::None:
      return "none";
    case GrammarSpec::Kind::JsonSchema:
      return "json_schema";
    case GrammarSpec::Kind::AnyJson:
      return "json_object";
    case GrammarSpec::Kind::StructuralTag:
      return "structural_tag";
  }
  return "none";
}

Result<GrammarSpec::Kind> kind_from_name(const std::string& s) {
  for (auto k : {GrammarSpec::Kind::None, GrammarSpec::Kind::JsonSchema, GrammarSpec::Kind::AnyJson,
                 GrammarSpec::Kind::StructuralTag})
    if (s == kind_name(k)) return k;
  return make_error("unknown grammar kind '" + s + "'");
}

#ifdef EXPERTD_HAVE_XGRAMMAR

class CompiledGrammar {
 public:
  explicit CompiledGrammar(xgrammar::CompiledGrammar g) : g(std::move(g)) {}
  xgrammar::CompiledGrammar g;
};

bool grammars_available() {
  return true;
}

struct Grammars::Impl {
  static xgrammar::TokenizerInfo info(const engine::Tokenizer& tok) {
    std::vector<std::string> vocab(size_t(tok.n_vocab()));
    std::vector<int32_t> stops;
    for (int32_t id = 0; id < tok.n_vocab(); ++id) {
      // End-of-generation tokens are the grammar's stop tokens, never text.
      if (tok.is_end_of_generation(id)) {
        stops.push_back(id);
        continue;
      }
      vocab[size_t(id)] = tok.piece(id, true);
    }
    return xgrammar::TokenizerInfo(vocab, xgrammar::VocabType::RAW, tok.n_vocab(), stops);
  }
  explicit Impl(const engine::Tokenizer& tok) : compiler(info(tok), 2) {}
  xgrammar::GrammarCompiler compiler;
};

Grammars::Grammars(const engine::Tokenizer& tok) : impl_(std::make_unique<Impl>(tok)) {}
Grammars::~Grammars() = default;

Result<std::shared_ptr<const CompiledGrammar>> Grammars::compile(const GrammarSpec& spec) {
  try {
    switch (spec.kind) {
      case GrammarSpec::Kind::JsonSchema:
        return std::make_shared<const CompiledGrammar>(
            impl_->compiler.CompileJSONSchema(spec.text, true, std::nullopt, std::nullopt, true,
                                              /*max_whitespace_cnt=*/2));
      case GrammarSpec::Kind::AnyJson:
        return std::make_shared<const CompiledGrammar>(impl_->compiler.CompileBuiltinJSONGrammar());
      case GrammarSpec::Kind::StructuralTag:
        return std::make_shared<const CompiledGrammar>(
            impl_->compiler.CompileStructuralTag(spec.text));
      case GrammarSpec::Kind::None:
        break;
    }
    return make_error("no grammar given");
  } catch (const std::exception& e) {
    return make_error(e.what());
  }
}

struct Constraint::Impl {
  explicit Impl(std::shared_ptr<const CompiledGrammar> g)
      : grammar(std::move(g)), matcher(grammar->g) {}
  std::shared_ptr<const CompiledGrammar> grammar;
  xgrammar::GrammarMatcher matcher;
  std::vector<int32_t> bits;
};

Constraint::Constraint(std::shared_ptr<const CompiledGrammar> g)
    : impl_(std::make_unique<Impl>(std::move(g))) {}
Constraint::~Constraint() = default;

void Constraint::mask(std::span<float> logits) {
  const int64_t n_vocab = impl_->grammar->g.GetTokenizerInfo().GetVocabSize();
  int64_t words = (n_vocab + 31) / 32;
  impl_->bits.assign(size_t(words), 0);
  DLTensor t{};
  t.data = impl_->bits.data();
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = DLDataType{kDLInt, 32, 1};
  t.shape = &words;
  impl_->matcher.FillNextTokenBitmask(&t);
  constexpr float kNo = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < logits.size(); ++i)
    if (int64_t(i) >= n_vocab || !((uint32_t(impl_->bits[i / 32]) >> (i % 32)) & 1u))
      logits[i] = kNo;
}

bool Constraint::accept(int32_t token) {
  return impl_->matcher.AcceptToken(token);
}

bool Constraint::terminated() const {
  return impl_->matcher.IsTerminated();
}

#else  // built without xgrammar: every compile is an error that says so

class CompiledGrammar {};

bool grammars_available() {
  return false;
}

struct Grammars::Impl {};
Grammars::Grammars(const engine::Tokenizer&) {}
Grammars::~Grammars() = default;
Result<std::shared_ptr<const CompiledGrammar>> Grammars::compile(const GrammarSpec&) {
  return make_error(
      "this expert-serve was built without xgrammar (scripts/install-xgrammar.sh installs it), "
      "so tool_choice \"required\"/named and response_format are not available");
}
struct Constraint::Impl {};
Constraint::Constraint(std::shared_ptr<const CompiledGrammar>) {}
Constraint::~Constraint() = default;
void Constraint::mask(std::span<float>) {}
bool Constraint::accept(int32_t) {
  return true;
}
bool Constraint::terminated() const {
  return false;
}

#endif

}  // namespace expertd::serve
