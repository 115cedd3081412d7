// Constrained decoding: a grammar (a JSON schema, any JSON, or a structural tag: text, then a
// tool call of a fixed shape with schema-checked arguments) compiled by xgrammar against the
// model's vocabulary; per sequence a matcher that masks the logits before each sample, so only
// tokens the grammar allows can be drawn, and follows each drawn token.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"
#include "engine/tokenizer.h"

namespace expertd::serve {

struct GrammarSpec {
  enum class Kind { None, JsonSchema, AnyJson, StructuralTag };
  Kind kind = Kind::None;
  std::string text;  // the schema or the structural tag, as JSON text
  explicit operator bool() const { return kind != Kind::None; }
};
const char* kind_name(GrammarSpec::Kind k);
Result<GrammarSpec::Kind> kind_from_name(const std::string& s);

class CompiledGrammar;  // xgrammar's, behind the wall

// Whether this expert-serve was built with xgrammar.
bool grammars_available();

// The grammars of one vocabulary: compiled once per distinct spec (xgrammar caches them).
class Grammars {
 public:
  explicit Grammars(const engine::Tokenizer& tok);
  ~Grammars();
  // An error names what in the schema or tag is wrong.
  Result<std::shared_ptr<const CompiledGrammar>> compile(const GrammarSpec& spec);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One sequence's place in its grammar.
class Constraint {
 public:
  explicit Constraint(std::shared_ptr<const CompiledGrammar> g);
  ~Constraint();
  // Tokens the grammar does not allow next get -infinity (ids past the vocabulary too).
  void mask(std::span<float> logits);
  // Follows a drawn token; false if the grammar did not allow it (the mask was not applied).
  bool accept(int32_t token);
  bool terminated() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace expertd::serve
