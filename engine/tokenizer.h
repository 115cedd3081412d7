// Tokenizer from GGUF metadata, with llama.cpp's semantics: byte-level BPE
// (tokenizer.ggml.model = gpt2) with each model's pre-tokenizer regexes (PCRE2, Unicode
// properties), and SentencePiece-style BPE (tokenizer.ggml.model = llama) with byte fallback.
// Special tokens written in the text are recognised when asked to.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/result.h"
#include "gguf/gguf_reader.h"

namespace engine {

class Tokenizer {
 public:
  static expertd::Result<Tokenizer> load(const gguf::Model& f);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // llama-tokenize semantics: special tokens in the text are parsed when parse_special.
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const;
  // The bytes of one token (control tokens: empty unless `special`).
  std::string piece(int32_t id, bool special = false) const;
  int n_vocab() const { return static_cast<int>(text_.size()); }
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  bool add_bos() const { return add_bos_; }
  bool is_end_of_generation(int32_t id) const;
  int32_t find(std::string_view text) const;  // -1 when absent
  const std::string& model() const { return model_; }
  const std::string& pre() const { return pre_; }

 private:
  Tokenizer() = default;
  void bpe_word(const std::string& word, std::vector<int32_t>& out) const;
  void spm_text(const std::string& text, std::vector<int32_t>& out) const;
  std::vector<std::string> pre_split(const std::string& text) const;

  std::string model_, pre_;
  std::vector<std::string> text_;
  std::vector<int32_t> type_;
  std::vector<float> score_;
  std::unordered_map<std::string, int32_t> id_of_;
  std::unordered_map<std::string, int32_t> merge_rank_;  // "left right" -> rank
  std::vector<int32_t> specials_;                        // matched in text, longest first
  // llama.cpp's token attributes LSTRIP / RSTRIP (set by model name, as llama.cpp does): the
  // whitespace before / after such a special token in the text is dropped.
  std::unordered_map<int32_t, uint8_t> strip_;
  std::unordered_set<int32_t> eog_;  // llama.cpp's end-of-generation tokens, by text
  struct Regexes;
  std::unique_ptr<Regexes> regexes_;
  int32_t bos_ = -1, eos_ = -1, eot_ = -1, unk_ = -1;
  bool add_bos_ = false, add_space_prefix_ = true, ignore_merges_ = false;
};

// Streams valid UTF-8: holds back an incomplete trailing sequence until its bytes arrive.
class Utf8Stream {
 public:
  std::string push(const std::string& bytes);
  std::string flush();

 private:
  std::string pending_;
};

}  // namespace engine
